package app

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/nodeclaim"
	"socialweb.computer/internal/infra"
)

// ensureNodeRequester makes the AtprotoRepo that tenant clusters' node contracts run the
// market from (infra.NodeRequesterRepo in the contract workspace): the local account. One
// that exists is left as it is.
func ensureNodeRequester(ctx context.Context, cfg *rest.Config) error {
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return err
	}
	r := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: nodeclaim.DefaultContractNamespace, Name: infra.NodeRequesterRepo},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: DefaultHandle}}}
	if err := c.Create(ctx, r); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("node requester repo %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}
