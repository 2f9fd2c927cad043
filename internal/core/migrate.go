package core

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// LegacySecretsCRD is the CRD of the Secret kind this group once had, when the embedded
// server served no core/v1.
const LegacySecretsCRD = "secrets.socialweb.computer"

var legacySecrets = schema.GroupVersionResource{Group: "socialweb.computer", Version: "v1alpha1", Resource: "secrets"}

// migrateLegacySecrets moves the objects of LegacySecretsCRD, if a data dir still has it, to
// core/v1 Secrets of the same namespace and name (data, type, labels and annotations kept),
// then deletes the CRD and with it the old objects. Each Secret is created before anything is
// deleted, and one that exists is left as it is, so a start cut short repeats the move.
func migrateLegacySecrets(ctx context.Context, cfg *rest.Config, log *slog.Logger) error {
	ext, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, LegacySecretsCRD, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("reading CRD %s: %w", LegacySecretsCRD, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	list, err := dyn.Resource(legacySecrets).List(ctx, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("listing %s: %w", LegacySecretsCRD, err)
	}
	moved := 0
	if list != nil {
		for _, old := range list.Items {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: old.GetNamespace(), Name: old.GetName(),
				Labels: old.GetLabels(), Annotations: old.GetAnnotations()}, Data: map[string][]byte{}}
			if t, ok := old.Object["type"].(string); ok && t != "" {
				s.Type = corev1.SecretType(t)
			}
			data, _ := old.Object["data"].(map[string]any)
			for k, v := range data {
				str, _ := v.(string)
				b, err := base64.StdEncoding.DecodeString(str)
				if err != nil {
					return fmt.Errorf("%s %s/%s key %q: %w", LegacySecretsCRD, s.Namespace, s.Name, k, err)
				}
				s.Data[k] = b
			}
			if _, err := cs.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("moving Secret %s/%s to core/v1: %w", s.Namespace, s.Name, err)
			}
			moved++
		}
	}
	if err := ext.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, LegacySecretsCRD, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting CRD %s: %w", LegacySecretsCRD, err)
	}
	log.Info("moved Secrets to core/v1", "secrets", moved, "crd_deleted", LegacySecretsCRD)
	return nil
}
