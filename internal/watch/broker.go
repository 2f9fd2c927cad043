// Package watch is the in-process fan-out of record changes seen by AtprotoRecordWatch
// objects. The AtprotoRecordWatch controller publishes each change after it has written the
// change (and the cursor past it) to the watch's status; other controllers subscribe and map
// changes to their own objects, typically by feeding a controller-runtime source.Channel.
//
// Delivery is in firehose order per watch and never blocks the publisher for long: a
// subscriber is a function, called synchronously, that should only enqueue.
package watch

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Action is what happened to a record.
type Action string

// Actions, as the firehose names them.
const (
	Create Action = "create"
	Update Action = "update"
	Delete Action = "delete"
)

// Change is one record operation seen by a watch.
type Change struct {
	// Watch is the AtprotoRecordWatch that saw the change.
	Watch types.NamespacedName
	// Seq is the firehose seq of the commit.
	Seq        int64
	DID        string
	Collection string
	RKey       string
	URI        string
	// CID is the record's new CID; "" for a delete.
	CID    string
	Action Action
}

// Broker fans changes out to subscribers. The zero Broker is ready to use.
type Broker struct {
	mu   sync.RWMutex
	next int
	subs map[int]func(Change)
}

// Subscribe registers fn for every change published from now on; cancel stops it.
func (b *Broker) Subscribe(fn func(Change)) (cancel func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = map[int]func(Change){}
	}
	id := b.next
	b.next++
	b.subs[id] = fn
	return func() {
		b.mu.Lock()
		delete(b.subs, id)
		b.mu.Unlock()
	}
}

// Publish calls every subscriber with c.
func (b *Broker) Publish(c Change) {
	if b == nil {
		return
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, fn := range b.subs {
		fn(c)
	}
}
