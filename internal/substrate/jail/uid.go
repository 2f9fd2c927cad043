package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"socialweb.computer/internal/dirlock"
)

// UIDs hands out host uids to guests, one each, across every substrate and state dir of the
// host: a uid is taken by creating Dir/<uid> exclusively, holding the owner (the guest's
// directory). An entry whose owner directory is gone is free again, so a guest removed
// without Release (a crash) does not keep its uid. Dir belongs on a tmpfs (/run): guests do
// not outlive a reboot.
type UIDs struct {
	Dir   string
	Base  int // first uid
	Count int // how many
}

// DefaultUIDs is the host-wide registry: uids 1800000000 to 1800065535, far above login
// users and the 65536-id blocks of the usual /etc/subuid ranges.
var DefaultUIDs = UIDs{Dir: "/run/socialweb/guest-uids", Base: 1800000000, Count: 65536}

// ErrNoUID is returned when every uid of the range is taken.
var ErrNoUID = errors.New("no free guest uid")

// Take gives owner (an absolute directory path) a uid of its own.
func (u UIDs) Take(owner string) (int, error) {
	if err := os.MkdirAll(u.Dir, 0o700); err != nil {
		return 0, err
	}
	// One taker at a time on the host: freeing a stale entry and taking it again is not one
	// step.
	release, err := dirlock.WaitFile(filepath.Join(u.Dir, ".lock"))
	if err != nil {
		return 0, err
	}
	defer release()
	for i := 0; i < u.Count; i++ {
		uid := u.Base + i
		p := filepath.Join(u.Dir, strconv.Itoa(uid))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
				if _, err := os.Stat(strings.TrimSpace(string(b))); errors.Is(err, os.ErrNotExist) {
					// Its owner is gone: free it, and try this uid again.
					if os.Remove(p) == nil {
						i--
					}
				}
			}
			continue
		}
		if err != nil {
			return 0, err
		}
		_, err = f.WriteString(owner + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(p)
			return 0, err
		}
		return uid, nil
	}
	return 0, fmt.Errorf("%w in %d..%d (%s)", ErrNoUID, u.Base, u.Base+u.Count-1, u.Dir)
}

// Release frees uid if owner holds it.
func (u UIDs) Release(uid int, owner string) {
	p := filepath.Join(u.Dir, strconv.Itoa(uid))
	if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == owner {
		_ = os.Remove(p)
	}
}
