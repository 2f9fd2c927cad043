package watch

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Source is a controller-runtime source that delivers every change published on b to h
// while the controller runs. A controller maps changes to its own objects with
// handler.TypedEnqueueRequestsFromMapFunc[Change]. The publisher waits while the
// channel's buffer is full: a slow controller slows the watch, it does not lose changes.
func (b *Broker) Source(h handler.TypedEventHandler[Change, reconcile.Request]) source.TypedSource[reconcile.Request] {
	return &brokerSource{b: b, h: h}
}

type brokerSource struct {
	b *Broker
	h handler.TypedEventHandler[Change, reconcile.Request]
}

func (s *brokerSource) String() string { return "watch.Broker" }

// Start subscribes for the lifetime of ctx (the controller's).
func (s *brokerSource) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	ch := make(chan event.TypedGenericEvent[Change], 1024)
	cancel := s.b.Subscribe(func(c Change) {
		select {
		case ch <- event.TypedGenericEvent[Change]{Object: c}:
		case <-ctx.Done():
		}
	})
	context.AfterFunc(ctx, cancel)
	return source.Channel[Change](ch, s.h).Start(ctx, q)
}
