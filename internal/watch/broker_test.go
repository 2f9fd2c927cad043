package watch

import (
	"sync"
	"testing"
)

func TestBrokerFanOutAndCancel(t *testing.T) {
	var b Broker
	var mu sync.Mutex
	got := map[string][]int64{}
	sub := func(name string) func(Change) {
		return func(c Change) {
			mu.Lock()
			got[name] = append(got[name], c.Seq)
			mu.Unlock()
		}
	}
	cancelA := b.Subscribe(sub("a"))
	b.Subscribe(sub("b"))
	b.Publish(Change{Seq: 1})
	cancelA()
	b.Publish(Change{Seq: 2})
	var nilBroker *Broker
	nilBroker.Publish(Change{Seq: 3}) // a controller without a broker publishes to nobody
	if len(got["a"]) != 1 || got["a"][0] != 1 {
		t.Fatalf("a got %v, want [1]", got["a"])
	}
	if len(got["b"]) != 2 || got["b"][1] != 2 {
		t.Fatalf("b got %v, want [1 2]", got["b"])
	}
}
