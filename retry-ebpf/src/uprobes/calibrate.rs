//! The cost of a uprobe on this node: an empty program the agent attaches to a function of its
//! own, in its own process only, and times (capture/calibrate.rs). A uprobe trap costs ~1 µs on
//! bare metal and can cost 15+ on a virtual machine; the Go probes take several per request.
use aya_ebpf::{macros::uprobe, programs::ProbeContext};

#[uprobe(path = "calibrate", function = "retry_agent_uprobe_calibration")]
pub fn ra_calibrate(_ctx: ProbeContext) -> u32 {
    0
}
