// Package crashpoint names the points between the steps of a multi-step write (a guest start:
// intent, boot, receipt) where a test needs the process to die, so that what recovery does
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
	// BidderAfterIntent: the start intent (before-boot) is on disk, the guest not booted.
	BidderAfterIntent = "bidder.after-intent"
	// BidderAfterBoot: the substrate's Boot returned, the intent still says before-boot.
	BidderAfterBoot = "bidder.after-boot"
	// BidderAfterReceipt: the receipt is in the repo, the intent still says booted.
	BidderAfterReceipt = "bidder.after-receipt"
	// BidderBeforeStarted: the intent says receipt-written, no vm.started event written.
	BidderBeforeStarted = "bidder.before-started"
)

// Names are every point, in the order a guest start reaches them.
var Names = []string{BidderAfterIntent, BidderAfterBoot, BidderAfterReceipt, BidderBeforeStarted}

// Env is the variable naming the point to die at.
const Env = "SOCIALWEB_CRASH_AT"
