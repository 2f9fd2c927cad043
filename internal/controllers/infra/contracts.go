package infra

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/infra"
)

// ownedContracts lists the ComputeContracts this deployment owns: labelled with its kind and
// name and controlled by this very object (a deleted namesake's leftovers are not ours).
// The label selector works against the cache and a plain API server alike.
func (r *Reconciler) ownedContracts(ctx context.Context, o *object) ([]infra.ExistingContract, error) {
	var list v1alpha1.ComputeContractList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.obj.GetNamespace()), client.MatchingLabels{
		v1alpha1.LabelInfraKind: string(r.Kind),
		v1alpha1.LabelInfraName: infra.LabelValue(o.obj.GetName()),
	}); err != nil {
		return nil, fmt.Errorf("listing ComputeContracts of %s: %w", o.obj.GetName(), err)
	}
	var out []infra.ExistingContract
	for i := range list.Items {
		cc := &list.Items[i]
		if ref := metav1.GetControllerOf(cc); ref == nil || ref.UID != o.obj.GetUID() {
			continue
		}
		out = append(out, infra.ExistingContract{Name: cc.Name, Contract: cc.Labels[v1alpha1.LabelInfraContract],
			Status: *cc.Status.DeepCopy(), Release: cc.Spec.Release.DeepCopy()})
	}
	return out, nil
}

// contracts plans each contract's ComputeContract (PlanContracts), applies the plan, and
// reports status.contracts, the phase, contractsReady and contractsByPhase.
func (r *Reconciler) contracts(ctx context.Context, p *pass) error {
	o := p.obj
	existing, err := r.ownedContracts(ctx, o)
	if err != nil {
		return err
	}
	plan := infra.PlanContracts(infra.ContractsInput{Kind: r.Kind, ObjectName: o.obj.GetName(), Spec: *o.spec,
		Previous: o.status.Contracts, Existing: existing, Ended: o.ended(), Now: p.now})
	for _, act := range plan.Actions {
		if err := r.applyContract(ctx, o, act); err != nil {
			return err
		}
	}
	o.status.Contracts = plan.Status
	o.status.Phase = infra.DeploymentPhase(plan.Status, false, o.ended())
	o.status.ContractsReady = infra.ContractsReady(o.spec.Contracts, plan.Status)
	o.status.ContractsByPhase = infra.ContractsByPhase(o.spec.Contracts, plan.Status)
	p.stalled = infra.Stalled(plan.Status, existing)
	return nil
}

// applyContract does one planned action. The controller is the only writer of a
// ComputeContract's spec: it creates it whole and afterwards only sets spec.release.
func (r *Reconciler) applyContract(ctx context.Context, o *object, act infra.ContractAction) error {
	ns := o.obj.GetNamespace()
	switch act.Op {
	case infra.OpCreate:
		cc := &v1alpha1.ComputeContract{
			ObjectMeta: metav1.ObjectMeta{Name: act.ComputeContract, Namespace: ns,
				Labels:          infra.ContractLabels(r.Kind, o.obj.GetName(), act.Contract),
				OwnerReferences: []metav1.OwnerReference{r.ownerRef(o, true)}},
			Spec: *act.Spec,
		}
		if err := r.Client.Create(ctx, cc); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating ComputeContract %s: %w", act.ComputeContract, err)
		}
		crashpoint.Hit(crashpoint.InfraAfterContractCreate)
		r.log().Info("infra_contract_requested", "object", o.obj.GetName(), "contract", act.Contract, "computeContract", act.ComputeContract)
	case infra.OpSetRelease:
		return r.releaseContract(ctx, ns, act.ComputeContract, act.Release)
	case infra.OpDelete:
		cc := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: act.ComputeContract, Namespace: ns}}
		if err := r.Client.Delete(ctx, cc); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ComputeContract %s: %w", act.ComputeContract, err)
		}
	}
	return nil
}

// releaseContract sets spec.release with a merge patch of that one field.
func (r *Reconciler) releaseContract(ctx context.Context, ns, name string, rel *v1alpha1.ContractRelease) error {
	body, err := json.Marshal(map[string]any{"spec": map[string]any{"release": rel}})
	if err != nil {
		return err
	}
	cc := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if err := r.Client.Patch(ctx, cc, client.RawPatch(types.MergePatchType, body)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing ComputeContract %s: %w", name, err)
	}
	crashpoint.Hit(crashpoint.InfraAfterRelease)
	r.log().Info("infra_contract_released", "computeContract", name, "reason", rel.Reason)
	return nil
}
