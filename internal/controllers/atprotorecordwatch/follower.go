package atprotorecordwatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

// checkpointEvery is how often a cursor advanced only by other repos' events is written.
const checkpointEvery = 2 * time.Second

// Stream retry bounds after a broken subscription.
const (
	streamBackoffBase = 100 * time.Millisecond
	streamBackoffMax  = 10 * time.Second
)

// followKey is what a follower follows; a change of any part restarts it.
type followKey struct {
	did, endpoint, collection string
	generation                int64
}

func (k followKey) sameTarget(o followKey) bool { return k == o }

// follower follows one watch's collection on one PDS's firehose.
type follower struct {
	r      *Reconciler
	name   types.NamespacedName
	key    followKey
	src    repos.EventSource
	cancel context.CancelFunc
	done   chan struct{}

	obj       *v1alpha1.AtprotoRecordWatch // as last written
	st        *state
	lastWrite time.Time
}

var errGone = errors.New("the watch is gone")

// run subscribes from the status cursor and resubscribes after every break until ctx ends.
func (f *follower) run(ctx context.Context) {
	log := f.r.Log.With("watch", f.name.String())
	failures := 0
	for ctx.Err() == nil {
		if err := f.load(ctx); err != nil {
			if errors.Is(err, errGone) {
				return
			}
			log.Warn("atprotorecordwatch_load_failed", "err", err)
			failures++
			sleep(ctx, repos.Backoff(failures, streamBackoffBase, streamBackoffMax))
			continue
		}
		cursor := f.st.cursor
		if err := f.checkpoint(ctx, metav1.ConditionTrue, ReasonFollowing, fmt.Sprintf("following %s from seq %d", f.key.endpoint, cursor)); err != nil {
			if errors.Is(err, errGone) {
				return
			}
			failures++
			sleep(ctx, repos.Backoff(failures, streamBackoffBase, streamBackoffMax))
			continue
		}
		progressed, err := f.follow(ctx, cursor)
		if ctx.Err() != nil || errors.Is(err, errGone) {
			return
		}
		if progressed {
			failures = 0
		}
		failures++
		log.Info("atprotorecordwatch_stream_broken", "err", err, "cursor", f.st.cursor)
		_ = f.checkpoint(ctx, metav1.ConditionFalse, ReasonStreamBroken, fmt.Sprintf("%v; resuming from seq %d", err, f.st.cursor))
		sleep(ctx, repos.Backoff(failures, streamBackoffBase, streamBackoffMax))
	}
}

// load reads the watch and takes its status as the starting state (an empty state when the
// status was written for another generation of the spec).
func (f *follower) load(ctx context.Context) error {
	var obj v1alpha1.AtprotoRecordWatch
	if err := f.r.Reader.Get(ctx, f.name, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return errGone
		}
		return err
	}
	if obj.Generation != f.key.generation {
		return errGone // a newer generation has its own follower
	}
	if obj.Status.ObservedGeneration == obj.Generation {
		f.st = stateFromStatus(obj.Status)
	} else {
		f.st = stateFromStatus(v1alpha1.AtprotoRecordWatchStatus{})
	}
	f.obj = &obj
	return nil
}

// maxBatch bounds how many queued events one checkpoint covers.
const maxBatch = 1024

// follow subscribes from cursor and folds the events in, in batches: the subscription queues
// events as they arrive, and each turn takes every event queued so far, applies them in order,
// writes one checkpoint and then publishes their changes. One change costs one status write
// as before; a burst (a thousand records written at once) costs a handful instead of one
// write of the whole record list per event. It returns whether any event arrived and why
// the subscription ended.
func (f *follower) follow(ctx context.Context, cursor int64) (bool, error) {
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	queue := make(chan repos.Event, maxBatch)
	ended := make(chan error, 1)
	go func() {
		ended <- f.src.Subscribe(subCtx, &cursor, func(ev repos.Event) error {
			select {
			case queue <- ev:
				return nil
			case <-subCtx.Done():
				return subCtx.Err()
			}
		})
	}()
	progressed, done := false, false
	var subErr error
	for {
		var batch []repos.Event
		endedCh := ended
		if done {
			endedCh = nil // already ended: only the queue is left to fold in
		}
		select {
		case ev := <-queue:
			batch = append(batch, ev)
		case subErr = <-endedCh:
			done = true
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case ev := <-queue:
				batch = append(batch, ev)
			default:
				break drain
			}
		}
		if len(batch) > 0 {
			progressed = true
			if err := f.handle(ctx, batch); err != nil {
				cancel()
				if !done {
					<-ended
				}
				return progressed, err
			}
		}
		if done && len(queue) == 0 {
			return progressed, subErr
		}
	}
}

// handle folds a batch of events in, in order; when any changed the collection, the state is
// checkpointed once and then every change is published.
func (f *follower) handle(ctx context.Context, batch []repos.Event) error {
	var changes []watch.Change
	for _, ev := range batch {
		changes = append(changes, f.st.apply(ev, f.key.did, f.key.collection)...)
	}
	if len(changes) == 0 {
		if time.Since(f.lastWrite) > checkpointEvery && f.st.cursor != f.obj.Status.Cursor {
			return f.checkpoint(ctx, metav1.ConditionTrue, ReasonFollowing, "")
		}
		return nil
	}
	if err := f.checkpoint(ctx, metav1.ConditionTrue, ReasonFollowing, ""); err != nil {
		return err
	}
	for _, c := range changes {
		c.Watch = f.name
		f.r.Broker.Publish(c)
	}
	return nil
}

// checkpoint writes the state and the Ready condition to the watch's status, by apply
// (reconcilekit.ApplyStatus, as FollowerStatusOwner): the state in memory is the truth for
// cursor, records and deleted, so there is nothing to read again first. msg "" keeps the
// current message. A watch whose generation moved on is gone for this follower: the object
// each apply returns carries the generation, so at most one checkpoint lands after a spec
// change, and it says which generation it observed (the next follower starts afresh).
func (f *follower) checkpoint(ctx context.Context, ready metav1.ConditionStatus, reason, msg string) error {
	if f.obj.Generation != f.key.generation {
		return errGone
	}
	obj := f.obj.DeepCopy()
	f.st.toStatus(&obj.Status)
	obj.Status.ObservedGeneration = obj.Generation
	if msg == "" {
		if c := meta.FindStatusCondition(obj.Status.Conditions, string(v1alpha1.ConditionReady)); c != nil && c.Reason == reason {
			msg = c.Message
		}
	}
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionReady),
		Status: ready, Reason: reason, Message: msg, ObservedGeneration: obj.Generation})
	_, err := reconcilekit.ApplyStatus(ctx, f.r.Client, FollowerStatusOwner, f.obj, obj)
	switch {
	case err == nil:
		f.obj, f.lastWrite = obj, time.Now()
		return nil
	case apierrors.IsNotFound(err):
		return errGone
	}
	return fmt.Errorf("writing status of %s: %w", f.name, err)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
