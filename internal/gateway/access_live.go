package gateway

import (
	"context"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// AccessNamespace is where the gateway reads its live allow-list: the GatewayAccess objects
// in it, which the operator edits with kubectl. What they admit is added to the flags'
// Access; they can never take away an account the flags admit.
const AccessNamespace = "gateway"

// AccessFromObjects is the union of what the objects admit, and the entries that are not
// DIDs (left out and logged: the API refuses them, this is the second line).
func AccessFromObjects(items []v1alpha1.GatewayAccess) (a Access, invalid []string) {
	for _, o := range items {
		for _, d := range o.Spec.Allow {
			if _, err := syntax.ParseDID(d); err != nil {
				invalid = append(invalid, d)
				continue
			}
			a.Allow = append(a.Allow, d)
		}
		a.Open = a.Open || o.Spec.Open
	}
	return a, invalid
}

// union is a with b's accounts added.
func union(a, b Access) Access {
	return Access{Allow: append(append([]string(nil), a.Allow...), b.Allow...), Open: a.Open || b.Open}
}

// applyAccess sets the gateway's access to the flags' with what items admit.
func (s *Server) applyAccess(items map[string]v1alpha1.GatewayAccess, source string) {
	list := make([]v1alpha1.GatewayAccess, 0, len(items))
	for _, o := range items {
		list = append(list, o)
	}
	live, invalid := AccessFromObjects(list)
	acc, err := newAccess(union(s.cfg.Access, live))
	if err != nil { // AccessFromObjects keeps only DIDs; the flags were checked at start
		s.log.Error("gateway_access", "err", err)
		return
	}
	s.access.Store(&acc)
	s.log.Info("gateway_access", "source", source, "objects", len(items), "allowed", len(acc.allow), "open", acc.open, "invalid", invalid)
}

// watchAccess keeps the gateway's access in step with the GatewayAccess objects until ctx
// ends. While the core cannot be reached the last list read holds (and the flags always
// do). listed is told (without blocking) once the first list is applied, or when it gives up.
func (s *Server) watchAccess(ctx context.Context, listed chan<- struct{}) {
	defer tell(listed)
	c := s.cfg.Client
	for ctx.Err() == nil {
		var list v1alpha1.GatewayAccessList
		if err := c.List(ctx, &list, client.InNamespace(AccessNamespace)); err != nil {
			s.log.Warn("gateway_access_list", "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		items := map[string]v1alpha1.GatewayAccess{}
		for _, o := range list.Items {
			items[o.Name] = o
		}
		s.applyAccess(items, "list")
		tell(listed)
		w, err := c.Watch(ctx, &v1alpha1.GatewayAccessList{}, client.InNamespace(AccessNamespace),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			s.log.Warn("gateway_access_watch", "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		s.followAccess(ctx, w, items)
		w.Stop()
	}
}

// followAccess applies each change until the watch ends (then the caller lists again).
func (s *Server) followAccess(ctx context.Context, w watch.Interface, items map[string]v1alpha1.GatewayAccess) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			o, isAccess := ev.Object.(*v1alpha1.GatewayAccess)
			switch {
			case ev.Type == watch.Error || !isAccess:
				return
			case ev.Type == watch.Deleted:
				delete(items, o.Name)
			case ev.Type == watch.Added || ev.Type == watch.Modified:
				items[o.Name] = *o
			default:
				continue
			}
			s.applyAccess(items, string(ev.Type))
		}
	}
}

// tell sends on ch (a channel of capacity 1) unless it is full.
func tell(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
