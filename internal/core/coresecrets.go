package core

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	apirest "k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	storagevalue "k8s.io/apiserver/pkg/storage/value"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/apis/core/install" // core/v1 <-> internal conversions, stringData included
	secretstorage "k8s.io/kubernetes/pkg/registry/core/secret/storage"
)

// installCoreSecrets serves core/v1 Secrets at /api/v1 with kube-apiserver's own storage
// and strategy (validation of names, keys, types and size; stringData merged into data;
// immutable), so that a manifest with `kind: Secret` works unchanged here and on any
// cluster, and credentials live in the kind every tool knows. It is the only core/v1
// resource served: the rest of the core group (Pods, Services, Namespaces ...) has no
// meaning in this store. Secrets are encrypted at rest with the data dir's key
// (encryptedResources), under the same etcd prefix kube-apiserver uses.
func installCoreSecrets(s *genericapiserver.GenericAPIServer, etcd *genericoptions.EtcdOptions, transformers storagevalue.ResourceTransformers) error {
	resources := serverstorage.NewResourceConfig()
	resources.EnableVersions(corev1.SchemeGroupVersion)
	factory := serverstorage.NewDefaultStorageFactory(etcd.StorageConfig, runtime.ContentTypeProtobuf, legacyscheme.Codecs,
		serverstorage.NewDefaultResourceEncodingConfig(legacyscheme.Scheme), resources, nil)
	store, err := secretstorage.NewREST(tooLargeOptions{etcd.CreateRESTOptionsGetter(factory, transformers)})
	if err != nil {
		return err
	}
	info := genericapiserver.NewDefaultAPIGroupInfo(corev1.GroupName, legacyscheme.Scheme, legacyscheme.ParameterCodec, legacyscheme.Codecs)
	info.VersionedResourcesStorageMap[corev1.SchemeGroupVersion.Version] = map[string]apirest.Storage{"secrets": store}
	return s.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, &info)
}
