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
	applied := make(chan error, len(crds))
	for _, want := range crds {
		go func() {
			if err := applyCRD(ctx, cs, want); err != nil {
				applied <- fmt.Errorf("installing CRD %s: %w", want.Name, err)
				return
			}
			applied <- nil
		}()
	}
	for range crds {
		if err := <-applied; err != nil {
			return err
		}
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	errs := make(chan error, len(crds))
	for _, crd := range crds {
		go func() {
			if err := waitServing(ctx, cs, dyn, crd); err != nil {
				errs <- err
				return
			}
			errs <- settleEstablished(ctx, cs, crd.Name, time.Now())
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
// changes only).
func settleEstablished(ctx context.Context, cs apiextensionsclient.Interface, name string, now time.Time) error {
	for {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("CRD %s: %w", name, err)
		}
		i := slices.IndexFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
			return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
		})
		settled := metav1.NewTime(now.Add(-JustEstablishedWindow))
		if i < 0 || !crd.Status.Conditions[i].LastTransitionTime.After(settled.Time) {
			return nil
		}
		crd.Status.Conditions[i].LastTransitionTime = settled
		_, err = cs.ApiextensionsV1().CustomResourceDefinitions().UpdateStatus(ctx, crd, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			if err != nil {
				return fmt.Errorf("CRD %s: settling Established: %w", name, err)
			}
			return nil
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

func applyCRD(ctx context.Context, cs apiextensionsclient.Interface, want *apiextensionsv1.CustomResourceDefinition) error {
	have, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, want.DeepCopy(), metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if unchanged(have, want) {
		return nil
	}
	upd := want.DeepCopy()
	upd.ResourceVersion = have.ResourceVersion
	_, err = cs.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, upd, metav1.UpdateOptions{})
	return err
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

func waitServing(ctx context.Context, cs apiextensionsclient.Interface, dyn dynamic.Interface, crd *apiextensionsv1.CustomResourceDefinition) error {
	var storage string
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage = v.Name
		}
	}
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: storage, Resource: crd.Spec.Names.Plural}
	var last error
	for {
		got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err == nil && established(got) {
			_, err = dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			if err == nil {
				return nil
			}
		}
		if err == nil {
			err = fmt.Errorf("not established yet")
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s does not serve: %v", crd.Name, last)
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
