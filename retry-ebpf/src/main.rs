#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::RingBuf,
    programs::TracePointContext,
};
use retry_common::Probe;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[tracepoint]
pub fn probe_enter_connect(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let ev = Probe { pid: (pid_tgid >> 32) as u32, tid: pid_tgid as u32, ts_ns: unsafe { bpf_ktime_get_ns() } };
    let _ = EVENTS.output(&ev, 0);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
