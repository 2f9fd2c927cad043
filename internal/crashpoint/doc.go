// Package crashpoint names the points between the steps of a multi-step write (a guest start:
// intent, boot, receipt) where a test needs the process to die (a guest start, the requester's records, the
// record writer's compare-and-swap, the Infra controller's contracts), so that what recovery does
// after a crash at exactly that point can be asserted end to end rather than hoped for.
//
// Hit(name) does nothing in an ordinary build: the function is empty and inlined away. A
// binary built with the build tag `crashpoints` (SOCIALWEB_BUILD_TAGS=crashpoints bash
// hack/build.sh) reads SOCIALWEB_CRASH_AT once; when it names the point reached, the process
// writes one line to stderr and exits with status 137, as SIGKILL would leave it, with no
// deferred function, flush or cleanup run. The build tag, rather than the variable alone,
// keeps a stray environment variable on a production host from killing its bidder.
package crashpoint

// The points, named after the component and the step just done.
const (
	// BidderBeforeBid: the bidder chose to bid on an rfp, the bid not written.
	BidderBeforeBid = "bidder.before-bid"
	// BidderAfterIntent: the start intent (before-boot) is on disk, the guest not booted.
	BidderAfterIntent = "bidder.after-intent"
	// DenoAfterStateDir: inside the deno substrate's Boot, the guest's state dir is made and
	// its uid taken, nothing written in it yet (no guest.json, no process).
	DenoAfterStateDir = "deno.after-state-dir"
	// GuestAfterSpawn: inside a substrate's Boot, the guest's supervisor process is running
	// (its own session, it outlives the bidder), its pid.json not written.
	GuestAfterSpawn = "guest.after-spawn"
	// BidderAfterBoot: the substrate's Boot returned, the intent still says before-boot.
	BidderAfterBoot = "bidder.after-boot"
	// BidderAfterReceipt: the receipt is in the repo, the intent still says booted.
	BidderAfterReceipt = "bidder.after-receipt"
	// BidderBeforeStarted: the intent says receipt-written, no vm.started event written.
	BidderBeforeStarted = "bidder.before-started"

	// The requester (the ComputeContract controller): a record written in its repo, the
	// status that names it not yet.

	// RequesterAfterRFP: payload, policy and rfp are in the repo, the status has no rfp.
	RequesterAfterRFP = "requester.after-rfp"
	// RequesterAfterAccept: the accept is in the repo, the status names no accept or winner.
	RequesterAfterAccept = "requester.after-accept"
	// RequesterAfterDelete: the delete event is on the receipt, the status has no delete.
	RequesterAfterDelete = "requester.after-delete"

	// The record writer (the AtprotoRecord controller).

	// RecordAfterRead: the record was read, the compare-and-swap write not made.
	RecordAfterRead = "record.after-read"
	// RecordAfterWrite: the compare-and-swap write landed, the status does not hold its CID.
	RecordAfterWrite = "record.after-write"

	// The Infra controller.

	// InfraAfterContractCreate: a ComputeContract was created, the Infra's status does not
	// list it.
	InfraAfterContractCreate = "infra.after-contract-create"
	// InfraAfterChildApply: the record child (AtprotoRecord) was created or updated, the
	// Infra's status not written.
	InfraAfterChildApply = "infra.after-child-apply"
	// InfraAfterRelease: a ComputeContract's spec.release was set (the Infra deleted or the
	// contract moved to Released), the Infra's status not written.
	InfraAfterRelease = "infra.after-release"
)

// Names are every point: the bid, a guest start's in the order it reaches them, then the requester's,
// the record writer's and the Infra controller's.
var Names = []string{BidderBeforeBid, BidderAfterIntent, DenoAfterStateDir, GuestAfterSpawn, BidderAfterBoot, BidderAfterReceipt, BidderBeforeStarted,
	RequesterAfterRFP, RequesterAfterAccept, RequesterAfterDelete,
	RecordAfterRead, RecordAfterWrite,
	InfraAfterContractCreate, InfraAfterChildApply, InfraAfterRelease}

// Env is the variable naming the point to die at.
const Env = "SOCIALWEB_CRASH_AT"
