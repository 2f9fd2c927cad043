package repos

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/pds"
)

// Login backoff defaults: a refused password is retried after 2 s, 4 s, ... up to 5 min.
const (
	DefaultLoginBackoffBase = 2 * time.Second
	DefaultLoginBackoffMax  = 5 * time.Minute
)

// Resolver turns AtprotoRepo objects into Repo handles and holds every remote session.
// It is safe for concurrent use by all controllers of a process.
type Resolver struct {
	// PDS is the embedded PDS that local repos live on; nil when the process runs none.
	PDS *pds.Server
	// Client reads AtprotoRepos and Secrets.
	Client client.Reader
	// LoginBackoffBase and LoginBackoffMax bound how often a refused login is retried;
	// zero means the defaults.
	LoginBackoffBase, LoginBackoffMax time.Duration

	mu      sync.Mutex
	remotes map[types.NamespacedName]*remoteEntry
	now     func() time.Time
}

// remoteEntry is the session (or the last failure) of one remote AtprotoRepo.
type remoteEntry struct {
	mu          sync.Mutex // serialises logins of this repo
	fingerprint [32]byte   // service, identifier and password the entry is for
	repo        *remoteRepo
	failures    int
	lastErr     error
	nextAttempt time.Time
	attempts    int
}

func (r *Resolver) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// ForRef returns the repo named by ref (its namespace defaulting to ns). A missing
// AtprotoRepo is ErrUnavailable.
func (r *Resolver) ForRef(ctx context.Context, ns string, ref v1alpha1.ObjectRef) (Repo, error) {
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	if key.Namespace == "" {
		key.Namespace = ns
	}
	var obj v1alpha1.AtprotoRepo
	if err := r.Client.Get(ctx, key, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: AtprotoRepo %s does not exist", ErrUnavailable, key)
		}
		return nil, fmt.Errorf("%w: reading AtprotoRepo %s: %v", ErrUnavailable, key, err)
	}
	return r.Connect(ctx, &obj)
}

// Connect returns a handle on obj's repo. For a remote repo it reuses the session it holds
// or logs in; after a refused login it does not try again before the backoff has passed
// and returns the last error (ErrLoginFailed, with RetryAfter) instead.
func (r *Resolver) Connect(ctx context.Context, obj *v1alpha1.AtprotoRepo) (Repo, error) {
	switch {
	case obj.Spec.Local != nil:
		return Local(ctx, r.PDS, obj.Spec.Local.Account)
	case obj.Spec.Remote != nil:
		return r.remote(ctx, obj)
	}
	return nil, fmt.Errorf("%w: AtprotoRepo %s/%s sets neither local nor remote", ErrUnavailable, obj.Namespace, obj.Name)
}

func (r *Resolver) remote(ctx context.Context, obj *v1alpha1.AtprotoRepo) (Repo, error) {
	spec := obj.Spec.Remote
	var sec corev1.Secret
	skey := types.NamespacedName{Namespace: obj.Namespace, Name: spec.CredentialsRef.Name}
	if err := r.Client.Get(ctx, skey, &sec); err != nil {
		return nil, fmt.Errorf("%w: credentials Secret %s: %v", ErrLoginFailed, skey, err)
	}
	k := spec.CredentialsRef.KeyOr(v1alpha1.DefaultCredentialsKey)
	pw, ok := sec.Data[k]
	if !ok {
		return nil, fmt.Errorf("%w: Secret %s has no key %q", ErrLoginFailed, skey, k)
	}
	fp := sha256.Sum256([]byte(spec.Service + "\x00" + spec.Identifier + "\x00" + string(pw)))

	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	r.mu.Lock()
	if r.remotes == nil {
		r.remotes = map[types.NamespacedName]*remoteEntry{}
	}
	e := r.remotes[key]
	if e == nil || e.fingerprint != fp {
		// New credentials (or a new repo) start with a clean slate.
		e = &remoteEntry{fingerprint: fp}
		r.remotes[key] = e
	}
	r.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.repo != nil {
		return e.repo, nil
	}
	now := r.clock()
	if now.Before(e.nextAttempt) {
		return nil, &backoffError{err: e.lastErr, retry: e.nextAttempt.Sub(now)}
	}
	e.attempts++
	rr, err := login(ctx, spec.Service, spec.Identifier, string(pw))
	if err != nil {
		base, max := r.LoginBackoffBase, r.LoginBackoffMax
		if base == 0 {
			base = DefaultLoginBackoffBase
		}
		if max == 0 {
			max = DefaultLoginBackoffMax
		}
		e.failures++
		wait := Backoff(e.failures, base, max)
		e.lastErr, e.nextAttempt = err, now.Add(wait)
		return nil, &backoffError{err: err, retry: wait}
	}
	e.failures, e.lastErr, e.nextAttempt = 0, nil, time.Time{}
	e.repo = rr
	rr.onAuthLost = func() { r.forget(key, rr) }
	return rr, nil
}

// forget drops a session the PDS no longer accepts, so the next Connect logs in again.
func (r *Resolver) forget(key types.NamespacedName, rr *remoteRepo) {
	r.mu.Lock()
	e := r.remotes[key]
	r.mu.Unlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	if e.repo == rr {
		e.repo = nil
	}
	e.mu.Unlock()
}

// Release drops what the resolver holds for an AtprotoRepo (when it is deleted).
func (r *Resolver) Release(key types.NamespacedName) {
	r.mu.Lock()
	delete(r.remotes, key)
	r.mu.Unlock()
}

// LoginAttempts is how many logins the resolver has made for a remote AtprotoRepo with its
// current credentials.
func (r *Resolver) LoginAttempts(key types.NamespacedName) int {
	r.mu.Lock()
	e := r.remotes[key]
	r.mu.Unlock()
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.attempts
}

// IsLoginFailure reports whether err says the credentials were refused.
func IsLoginFailure(err error) bool { return errors.Is(err, ErrLoginFailed) }
