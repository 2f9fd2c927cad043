package core

import (
	"context"
	"fmt"
	"slices"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// InstallCRDs creates or updates each CRD and returns once every one of them is Established
// and its resource endpoint answers a list. Established alone is not enough: the first
// request to a new CRD's endpoint can block for seconds while its storage starts, and a
// controller that starts then sees timeouts instead of objects.
func InstallCRDs(ctx context.Context, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) error {
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// One list rather than a get per CRD: on a restart every CRD is there already, and this
	// is the whole of what the apply needs to know.
	stored, err := cs.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing CRDs: %w", err)
	}
	have := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for i := range stored.Items {
		have[stored.Items[i].Name] = &stored.Items[i]
	}
	type result struct {
		crd *apiextensionsv1.CustomResourceDefinition // as stored after the apply
		err error
	}
	applied := make([]chan result, len(crds))
	for i, want := range crds {
		applied[i] = make(chan result, 1)
		go func() {
			got, err := applyCRD(ctx, cs, have[want.Name], want)
			if err != nil {
				err = fmt.Errorf("installing CRD %s: %w", want.Name, err)
			}
			applied[i] <- result{got, err}
		}()
	}
	after := make([]*apiextensionsv1.CustomResourceDefinition, len(crds))
	for i := range crds {
		r := <-applied[i]
		if r.err != nil {
			return r.err
		}
		after[i] = r.crd
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	errs := make(chan error, len(crds))
	for i, crd := range crds {
		go func() {
			got, err := waitServing(ctx, cs, dyn, crd, after[i])
			if err != nil {
				errs <- err
				return
			}
			errs <- settleEstablished(ctx, cs, got, time.Now())
		}()
	}
	for range crds {
		if err := <-errs; err != nil {
			return err
		}
	}
	return waitDiscovered(ctx, cfg, crds)
}

// JustEstablishedWindow is how long apiextensions-apiserver holds back every create of a
// CRD's objects (it sleeps that long) after the CRD turned Established: time for the other
// members of an HA control plane to see the CRD before a client follows up there.
const JustEstablishedWindow = 2 * time.Second

// settleEstablished moves the Established condition of a CRD established less than
// JustEstablishedWindow before now to that long before now. The embedded core is one API
// server with no peer to wait for; without this, the first create of each kind after a
// fresh start waits two seconds for nothing. Only the condition's time changes: the CRD's
// storage and served versions stay as they are (the handler rebuilds them on spec or name
// changes only). crd is the CRD as last read; it is read again only on a conflict.
func settleEstablished(ctx context.Context, cs apiextensionsclient.Interface, crd *apiextensionsv1.CustomResourceDefinition, now time.Time) error {
	name := crd.Name
	for {
		i := slices.IndexFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
			return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
		})
		settled := metav1.NewTime(now.Add(-JustEstablishedWindow))
		if i < 0 || !crd.Status.Conditions[i].LastTransitionTime.After(settled.Time) {
			return nil
		}
		crd = crd.DeepCopy()
		crd.Status.Conditions[i].LastTransitionTime = settled
		_, err := cs.ApiextensionsV1().CustomResourceDefinitions().UpdateStatus(ctx, crd, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			if err != nil {
				return fmt.Errorf("CRD %s: settling Established: %w", name, err)
			}
			return nil
		}
		if crd, err = cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("CRD %s: %w", name, err)
		}
	}
}

// waitDiscovered returns once discovery lists every CRD's resource. The discovery documents
// are updated by a controller of their own after the endpoints serve, and a client whose REST
// mapper read discovery in between fails with "no matches for kind" instead of waiting.
func waitDiscovered(ctx context.Context, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	var missing []string
	for {
		// A group that fails to answer (err) does not hide the ones that did.
		_, lists, err := dc.ServerGroupsAndResources()
		missing = missing[:0]
		if lists != nil {
			listed := map[string]bool{}
			for _, l := range lists {
				for _, r := range l.APIResources {
					listed[l.GroupVersion+"/"+r.Name] = true
				}
			}
			for _, crd := range crds {
				for _, v := range crd.Spec.Versions {
					if gv := crd.Spec.Group + "/" + v.Name + "/" + crd.Spec.Names.Plural; v.Served && !listed[gv] {
						missing = append(missing, gv)
					}
				}
			}
			if len(missing) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("discovery does not list %v (%v)", missing, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// applyCRD creates want, or updates have (want as stored, nil if it is not) to it unless it
// is unchanged, and returns the CRD as stored after that.
func applyCRD(ctx context.Context, cs apiextensionsclient.Interface, have, want *apiextensionsv1.CustomResourceDefinition) (*apiextensionsv1.CustomResourceDefinition, error) {
	if have == nil {
		got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, want.DeepCopy(), metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			return got, err
		}
		// Created since the list (another process installing the same CRDs): update it.
		if have, err = cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, want.Name, metav1.GetOptions{}); err != nil {
			return nil, err
		}
	}
	if unchanged(have, want) {
		return have, nil
	}
	upd := want.DeepCopy()
	upd.ResourceVersion = have.ResourceVersion
	return cs.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, upd, metav1.UpdateOptions{})
}

// unchanged says whether have, as the API server stores it, already is want: then the update
// is skipped, since even an update that changes nothing is decoded, validated and its schema
// checked in full, which on every restart cost tens of milliseconds a CRD.
func unchanged(have, want *apiextensionsv1.CustomResourceDefinition) bool {
	defaulted := want.DeepCopy()
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(defaulted)
	return equality.Semantic.DeepEqual(have.Spec, defaulted.Spec) &&
		equality.Semantic.DeepEqual(have.Labels, defaulted.Labels) &&
		equality.Semantic.DeepEqual(have.Annotations, defaulted.Annotations)
}

// waitServing returns once crd is Established and its storage version's endpoint answers a
// list, with the CRD as last read. seen is the CRD as the apply left it: when it is
// Established already (a restart) the first round reads nothing more.
func waitServing(ctx context.Context, cs apiextensionsclient.Interface, dyn dynamic.Interface, crd, seen *apiextensionsv1.CustomResourceDefinition) (*apiextensionsv1.CustomResourceDefinition, error) {
	var storage string
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage = v.Name
		}
	}
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: storage, Resource: crd.Spec.Names.Plural}
	var last error
	got := seen
	for {
		var err error
		if got == nil || !established(got) {
			got, err = cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		}
		if err == nil && established(got) {
			_, err = dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				return got, nil
			}
		}
		if err == nil {
			err = fmt.Errorf("not established yet")
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("CRD %s does not serve: %v", crd.Name, last)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
