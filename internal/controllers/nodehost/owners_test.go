package nodehost

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestWantedPods(t *testing.T) {
	now := metav1.Now()
	cases := []struct {
		name   string
		obj    metav1.Object
		want   int
		wantOK bool
	}{
		{"a ReplicaSet: its replicas", &appsv1.ReplicaSet{Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](5)}}, 5, true},
		{"a ReplicaSet without replicas: 1", &appsv1.ReplicaSet{}, 1, true},
		{"a ReplicaSet scaled to zero", &appsv1.ReplicaSet{Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](0)}}, 0, true},
		{"a ReplicaSet being deleted: not known", &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](5)}}, 0, false},
		{"an OrderedReady StatefulSet: one at a time", &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3)}}, 1, true},
		{"a Parallel StatefulSet: its replicas", &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3),
			PodManagementPolicy: appsv1.ParallelPodManagement}}, 3, true},
		{"a Job: its parallelism", &batchv1.Job{Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](4)}}, 4, true},
		{"a Job: capped by the completions left", &batchv1.Job{Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](4), Completions: ptr.To[int32](6)},
			Status: batchv1.JobStatus{Succeeded: 4}}, 2, true},
		{"a Job done: none", &batchv1.Job{Spec: batchv1.JobSpec{Completions: ptr.To[int32](2)}, Status: batchv1.JobStatus{Succeeded: 2}}, 0, true},
		{"a suspended Job: none", &batchv1.Job{Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](4), Suspend: ptr.To(true)}}, 0, true},
		{"a Deployment is not a pod's controller", &appsv1.Deployment{}, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, ok := WantedPods(tc.obj)
			if n != tc.want || ok != tc.wantOK {
				t.Fatalf("WantedPods = %d, %v; want %d, %v", n, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestOwnersSettled(t *testing.T) {
	now := metav1.Now()
	of := func(uid types.UID) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: string(uid), UID: uid, Controller: ptr.To(true)}}
		}
	}
	bound := func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.Status.Phase = corev1.PodRunning }
	cases := []struct {
		name   string
		pods   []*corev1.Pod
		wanted map[types.UID]int
		want   []types.UID
	}{
		{"all its pods made, each tried", []*corev1.Pod{pod("a", all(of("rs"), unschedulable)), pod("b", all(of("rs"), unschedulable)), pod("c", all(of("rs"), bound))},
			map[types.UID]int{"rs": 3}, []types.UID{"rs"}},
		{"one pod still to be made", []*corev1.Pod{pod("a", all(of("rs"), unschedulable)), pod("b", all(of("rs"), unschedulable))},
			map[types.UID]int{"rs": 3}, nil},
		{"one pod not yet tried by the scheduler", []*corev1.Pod{pod("a", all(of("rs"), unschedulable)), pod("b", of("rs"))},
			map[types.UID]int{"rs": 2}, nil},
		{"a finished pod does not count", []*corev1.Pod{pod("a", all(of("rs"), unschedulable)),
			pod("b", all(of("rs"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }))},
			map[types.UID]int{"rs": 2}, nil},
		{"a pod being deleted does not count", []*corev1.Pod{pod("a", all(of("rs"), unschedulable)),
			pod("b", all(of("rs"), bound, func(p *corev1.Pod) { p.DeletionTimestamp = &now }))},
			map[types.UID]int{"rs": 2}, nil},
		{"more pods than wanted (scaling down): settled", []*corev1.Pod{pod("a", all(of("rs"), unschedulable)), pod("b", all(of("rs"), bound))},
			map[types.UID]int{"rs": 1}, []types.UID{"rs"}},
		{"each controller on its own", []*corev1.Pod{pod("a", all(of("x"), unschedulable)), pod("b", all(of("y"), unschedulable))},
			map[types.UID]int{"x": 1, "y": 2}, []types.UID{"x"}},
		{"a controller not read is not settled", []*corev1.Pod{pod("a", all(of("x"), unschedulable))}, map[types.UID]int{}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := OwnersSettled(tc.pods, tc.wanted)
			if len(got) != len(tc.want) {
				t.Fatalf("settled %v, want %v", got, tc.want)
			}
			for _, uid := range tc.want {
				if !got[uid] {
					t.Fatalf("settled %v, want %v", got, tc.want)
				}
			}
		})
	}
}
