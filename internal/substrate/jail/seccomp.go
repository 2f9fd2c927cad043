package jail

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Seccomp return actions and the offsets of struct seccomp_data that the filter reads.
const (
	retAllow       = 0x7fff0000
	retErrno       = 0x00050000
	retKillProcess = 0x80000000
	offNr          = 0
	offArch        = 4
	offArg0        = 16 // low 32 bits of args[0] (little endian)
	x32Bit         = 0x40000000
)

// deniedSyscalls fail with EPERM in a jailed program: what changes namespaces, mounts or the
// kernel, reaches into other processes, or opens kernel interfaces that a JavaScript runtime
// does not use and that are a frequent way into the kernel (bpf, perf, userfaultfd, keyrings,
// io_uring). Without capabilities most already fail; unshare(CLONE_NEWUSER) and the user
// namespaces it opens, where the program would hold every capability, do not.
var deniedSyscalls = []uintptr{
	unix.SYS_UNSHARE, unix.SYS_SETNS, unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT,
	unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_ACCT, unix.SYS_QUOTACTL,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_SETHOSTNAME, unix.SYS_SETDOMAINNAME,
}

// nsCloneFlags are the clone flags that make namespaces.
const nsCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// auditArch is the AUDIT_ARCH of this build; the filter kills a process that calls in with
// another ABI (whose syscall numbers differ).
func auditArch() (uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, nil
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, nil
	}
	return 0, fmt.Errorf("no seccomp filter for %s", runtime.GOARCH)
}

// seccompFilter is the BPF program: the right ABI, then EPERM for the denied syscalls and for
// clone with a namespace flag, ENOSYS for clone3 (its flags are behind a pointer the filter
// cannot read; libc falls back to clone), everything else allowed.
func seccompFilter() ([]unix.SockFilter, error) {
	arch, err := auditArch()
	if err != nil {
		return nil, err
	}
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
	)
	eperm := stmt(ret, retErrno|uint32(unix.EPERM))
	p := []unix.SockFilter{
		stmt(ldAbs, offArch),
		jump(jeq, arch, 1, 0),
		stmt(ret, retKillProcess),
		stmt(ldAbs, offNr),
	}
	if runtime.GOARCH == "amd64" {
		// The x32 ABI reaches the same syscalls under other numbers.
		p = append(p, jump(jge, x32Bit, 0, 1), eperm)
	}
	for _, nr := range deniedSyscalls {
		p = append(p, jump(jeq, uint32(nr), 0, 1), eperm)
	}
	p = append(p,
		jump(jeq, unix.SYS_CLONE3, 0, 1),
		stmt(ret, retErrno|uint32(unix.ENOSYS)),
		jump(jeq, unix.SYS_CLONE, 0, 3),
		stmt(ldAbs, offArg0),
		jump(jset, nsCloneFlags, 0, 1),
		eperm,
		stmt(ret, retAllow),
	)
	return p, nil
}

// installSeccomp installs the filter on this process (no_new_privs must be set); its
// children inherit it.
func installSeccomp() error {
	p, err := seccompFilter()
	if err != nil {
		return err
	}
	prog := unix.SockFprog{Len: uint16(len(p)), Filter: &p[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		return fmt.Errorf("seccomp filter: %v", err)
	}
	return nil
}
