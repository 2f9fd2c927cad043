package core

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	"k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	kubeopenapi "k8s.io/kubernetes/pkg/generated/openapi"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	"sigs.k8s.io/yaml"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/certs"
)

// AdminUser is the identity of the core's admin token.
const AdminUser = "socialweb-admin"

// encryptedResources are encrypted at rest in etcd: core/v1 Secrets.
var encryptedResources = []string{"secrets"}

type apiServerParams struct {
	etcdURL    string
	listener   net.Listener
	pki        *pki
	adminToken string
	encryption string // path of the EncryptionConfiguration
	watchCache bool
}

// newAPIServer builds an apiextensions-apiserver the way options.Config does, minus the
// parts that need a core/v1 API (service resolution for webhooks, admission, flow control),
// plus token authentication, a group authorizer and discovery at /apis.
func newAPIServer(p apiServerParams) (*apiextensionsapiserver.CustomResourceDefinitions, error) {
	o := options.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	o.RecommendedOptions.Etcd.StorageConfig.Transport.ServerList = []string{p.etcdURL}
	o.RecommendedOptions.Etcd.EncryptionProviderConfigFilepath = p.encryption
	o.RecommendedOptions.Etcd.EnableWatchCache = p.watchCache
	o.RecommendedOptions.SecureServing.Listener = p.listener
	o.RecommendedOptions.SecureServing.BindAddress = net.ParseIP("127.0.0.1")
	o.RecommendedOptions.SecureServing.ServerCert.CertKey.CertFile = p.pki.ServingCrt
	o.RecommendedOptions.SecureServing.ServerCert.CertKey.KeyFile = p.pki.ServingKey
	o.RecommendedOptions.Authentication = nil
	o.RecommendedOptions.Authorization = nil
	o.RecommendedOptions.CoreAPI = nil
	o.RecommendedOptions.Admission = nil
	o.RecommendedOptions.Features.EnablePriorityAndFairness = false
	o.ServerRunOptions.MaxRequestBodyBytes = MaxRequestBodyBytes
	if err := o.Complete(); err != nil {
		return nil, err
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}

	serverConfig := genericapiserver.NewRecommendedConfig(apiextensionsapiserver.Codecs)
	if err := o.ServerRunOptions.ApplyTo(&serverConfig.Config); err != nil {
		return nil, err
	}
	if err := applySecureServing(o.RecommendedOptions.SecureServing.SecureServingOptions, &serverConfig.Config); err != nil {
		return nil, err
	}
	o.RecommendedOptions.SecureServing = nil // applied above
	if err := o.RecommendedOptions.ApplyTo(serverConfig); err != nil {
		return nil, err
	}
	if err := o.APIEnablement.ApplyTo(&serverConfig.Config, apiextensionsapiserver.DefaultAPIResourceConfigSource(), apiextensionsapiserver.Scheme); err != nil {
		return nil, err
	}
	namer := openapinamer.NewDefinitionNamer(apiextensionsapiserver.Scheme, scheme.Scheme, legacyscheme.Scheme)
	defs := openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(openAPIDefinitions)
	// Both OpenAPI versions: the CRD OpenAPI controllers run only when v2 is configured, and
	// kubectl explain reads v3.
	serverConfig.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(defs, namer)
	serverConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(defs, namer)

	// Inside authentication and authorization: a stranger still gets 401.
	serverConfig.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		return genericapiserver.DefaultBuildHandlerChain(limitLargeBodies(refuseCustomResourceProtobuf(h), runtime.GOMAXPROCS(0)), c)
	}

	admin := &user.DefaultInfo{Name: AdminUser, Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated}}
	serverConfig.Authentication.Authenticator = authenticatorfactory.NewFromTokens(map[string]*user.DefaultInfo{p.adminToken: admin}, nil)
	serverConfig.Authorization.Authorizer = authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)

	cfg := &apiextensionsapiserver.Config{
		GenericConfig: serverConfig,
		ExtraConfig: apiextensionsapiserver.ExtraConfig{
			CRDRESTOptionsGetter: tooLargeOptions{options.NewCRDRESTOptionsGetter(*o.RecommendedOptions.Etcd, serverConfig.ResourceTransformers, serverConfig.StorageObjectCountTracker)},
			ServiceResolver:      noServices{},
			AuthResolverWrapper:  webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, serverConfig.LoopbackClientConfig, noopoteltrace.NewTracerProvider()),
		},
	}
	server, err := cfg.Complete().New(genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	if err := installCoreSecrets(server.GenericAPIServer, o.RecommendedOptions.Etcd, serverConfig.ResourceTransformers); err != nil {
		return nil, fmt.Errorf("core/v1 Secrets: %w", err)
	}
	serveRootDiscovery(server)
	return server, nil
}

// openAPIDefinitions are apiextensions' and, for the core/v1 Secrets served beside them,
// kube-apiserver's.
func openAPIDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := kubeopenapi.GetOpenAPIDefinitions(ref)
	for name, def := range generatedopenapi.GetOpenAPIDefinitions(ref) {
		defs[name] = def
	}
	return defs
}

// applySecureServing serves HTTPS with the data dir's serving certificate and gives the
// server's own loopback client a fresh self-signed pair and token, as the stock
// SecureServingOptionsWithLoopback does, but with a P-256 key: the stock one generates a
// 2048-bit RSA key on every start, which took a quarter of a second of `up`'s start-up here.
func applySecureServing(o *genericoptions.SecureServingOptions, cfg *genericapiserver.Config) error {
	if err := o.ApplyTo(&cfg.SecureServing); err != nil {
		return err
	}
	// The pair lives in memory for one start; its validity only has to outlast the process.
	certPEM, keyPEM, err := certs.SelfSigned(genericapiserver.LoopbackClientServerNameOverride, certs.CAValidity)
	if err != nil {
		return fmt.Errorf("loopback certificate: %w", err)
	}
	loopback, err := dynamiccertificates.NewStaticSNICertKeyContent("self-signed loopback", certPEM, keyPEM, genericapiserver.LoopbackClientServerNameOverride)
	if err != nil {
		return fmt.Errorf("loopback certificate: %w", err)
	}
	// First, so it wins over any other certificate for the same name.
	cfg.SecureServing.SNICerts = append([]dynamiccertificates.SNICertKeyContentProvider{loopback}, cfg.SecureServing.SNICerts...)
	token, err := randomKey32()
	if err != nil {
		return err
	}
	cfg.LoopbackClientConfig, err = cfg.SecureServing.NewLoopbackClientConfig(token, certPEM)
	return err
}

// noServices answers every conversion-webhook service lookup: the embedded server has no
// Services, so a CRD must name its webhook by URL.
type noServices struct{}

func (noServices) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return nil, fmt.Errorf("service %s/%s: the embedded API server has no Services; give the webhook a URL", namespace, name)
}

// writeEncryptionConfig writes the EncryptionConfiguration once, with a fresh 32-byte
// secretbox key, 0600 in the data dir; later starts reuse it so stored data stays readable.
// A data dir written when credentials were a kind of ours (secrets.socialweb.computer) gets
// core Secrets added to the encrypted resources, its key kept.
func writeEncryptionConfig(path string) error {
	if old, err := os.ReadFile(path); err == nil {
		cfg, changed, err := withEncryptedResources(old, encryptedResources)
		if err != nil || !changed {
			return err
		}
		return atomicfile.Write(path, cfg, 0o600)
	} else if !os.IsNotExist(err) {
		return err
	}
	key, err := randomKey32()
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [%s]
    providers:
      - secretbox:
          keys:
            - name: key1
              secret: %s
      - identity: {}
`, strings.Join(encryptedResources, ", "), key)
	return atomicfile.Write(path, []byte(cfg), 0o600)
}

// withEncryptedResources adds the resources missing from the first rule of an
// EncryptionConfiguration (the data dir's, which has one), keeping its providers and keys.
func withEncryptedResources(data []byte, want []string) ([]byte, bool, error) {
	var cfg apiserverv1.EncryptionConfiguration
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil || len(cfg.Resources) == 0 {
		return nil, false, fmt.Errorf("the data dir's encryption configuration does not read (%v); it holds the key of the stored Secrets, restore it from a backup", err)
	}
	changed := false
	for _, r := range want {
		if !slices.Contains(cfg.Resources[0].Resources, r) {
			cfg.Resources[0].Resources = append(cfg.Resources[0].Resources, r)
			changed = true
		}
	}
	if !changed {
		return data, false, nil
	}
	out, err := yaml.Marshal(&cfg)
	return out, true, err
}

// waitReady polls /readyz through the loopback client until it answers ok.
func waitReady(ctx context.Context, get func(ctx context.Context, path string) (int, error), timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		code, err := get(ctx, "/readyz")
		if err == nil && code == 200 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("/readyz answered %d", code)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("API server not ready after %s: %v", timeout, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
