//! What one uprobe hit costs on this node, measured at start: an empty program on a function of
//! the agent's own, in its own process only, timed over a few thousand calls with and without it.
//!
//! A uprobe is a breakpoint trap: ~1 µs on bare metal, but 15 µs and more on some virtual
//! machines (measured here: 16 µs; an empty uprobe on a Go server's ServeHTTP alone took it from
//! 113k to 35k requests/s). The Go probes take several per request, so where a hit is that dear
//! `--capture-go auto` leaves them off and says so rather than take most of a Go service's
//! throughput.
use std::{
    hint::black_box,
    num::NonZeroU32,
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    programs::{ProgramError, UProbe, uprobe::UProbeScope},
};

use super::{
    CaptureConfig, GoMode,
    programs::{Hook, ProgramSpec, UprobeTarget},
};

/// The function the calibration program probes: never inlined, next to nothing inside.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn retry_agent_uprobe_calibration(x: u64) -> u64 {
    black_box(x).wrapping_add(1)
}

/// Calls per timing round (at 20 µs a hit, 40 ms).
const CALLS: u32 = 2_000;
/// Rounds timed, the fastest kept (the machine is shared).
const ROUNDS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("the eBPF object has no calibration program")]
    NoProgram,
    #[error("the calibration uprobe: {0}")]
    Program(#[from] ProgramError),
    #[error("finding the calibration function in the agent's executable: {0}")]
    Locate(String),
}

/// Whether the Go uprobes go on (`--capture-go`), and what a uprobe hit costs here when that was
/// measured: for `auto`, and to warn a TLS user what each SSL call will pay.
pub(crate) fn go_uprobes(
    cfg: &CaptureConfig,
    ebpf: &mut Ebpf,
    specs: &[ProgramSpec],
) -> (bool, Option<Duration>) {
    let cost = match (cfg.go == GoMode::Auto || cfg.tls).then(|| uprobe_cost(ebpf, specs)) {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "could not measure what a uprobe costs here");
            None
        }
        None => None,
    };
    let dear = cost.filter(|c| *c > Duration::from_micros(cfg.go_max_uprobe_us));
    if cfg.tls
        && let Some(c) = dear
    {
        tracing::warn!(
            uprobe_cost_ns = c.as_nanos() as u64,
            "--capture-tls is on where a uprobe hit is dear: every SSL_read and SSL_write pays two"
        );
    }
    let on = match (cfg.go, dear) {
        (GoMode::On, _) => true,
        (GoMode::Off, _) => false,
        (GoMode::Auto, Some(c)) => {
            tracing::warn!(
                uprobe_cost_ns = c.as_nanos() as u64,
                max_us = cfg.go_max_uprobe_us,
                "Go uprobes off: a uprobe hit costs more than --capture-go-max-uprobe-us on this node and a Go service would pay it several times per request; Go services get thread-level linking only (--capture-go true turns them on anyway)"
            );
            false
        }
        // Cheap, or the measurement failed (then on, as before `auto` existed).
        (GoMode::Auto, None) => {
            tracing::info!(uprobe_cost = ?cost, "Go uprobes on");
            true
        }
    };
    (on, cost)
}

/// The cost of one uprobe hit on this node (the program loaded, attached, timed and detached).
pub(crate) fn uprobe_cost(
    ebpf: &mut Ebpf,
    specs: &[ProgramSpec],
) -> Result<Duration, CalibrationError> {
    let name = specs
        .iter()
        .find(|s| matches!(&s.hook, Hook::Uprobe(u) if u.target == UprobeTarget::Calibrate))
        .ok_or(CalibrationError::NoProgram)?
        .name
        .clone();
    let (exe, offset) = own_file_offset(retry_agent_uprobe_calibration as *const () as u64)?;
    let prog: &mut UProbe = ebpf
        .program_mut(&name)
        .ok_or(CalibrationError::NoProgram)?
        .try_into()?;
    prog.load()?;
    let pid =
        NonZeroU32::new(std::process::id()).ok_or(CalibrationError::Locate("pid 0".into()))?;
    let bare = fastest_round();
    let link = prog.attach([offset], &exe, UProbeScope::OneProcess(pid))?;
    let probed = fastest_round();
    prog.detach(link)?;
    let _ = prog.unload();
    Ok(probed.saturating_sub(bare) / CALLS)
}

fn fastest_round() -> Duration {
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let mut x = 0u64;
            for _ in 0..CALLS {
                x = retry_agent_uprobe_calibration(x);
            }
            black_box(x);
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// The file and file offset the code at `addr` of this process was mapped from.
fn own_file_offset(addr: u64) -> Result<(PathBuf, u64), CalibrationError> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| CalibrationError::Locate(format!("/proc/self/maps: {e}")))?;
    file_offset_in(&maps, addr)
        .ok_or_else(|| CalibrationError::Locate(format!("no file mapping holds {addr:#x}")))
}

/// `addr`'s mapping in a `/proc/PID/maps` text: its file and the offset in it.
fn file_offset_in(maps: &str, addr: u64) -> Option<(PathBuf, u64)> {
    maps.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (lo, hi) = f.next()?.split_once('-')?;
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).ok()?,
            u64::from_str_radix(hi, 16).ok()?,
        );
        let _perms = f.next()?;
        let off = u64::from_str_radix(f.next()?, 16).ok()?;
        let (_dev, _inode) = (f.next()?, f.next()?);
        let path: Vec<&str> = f.collect();
        let path = path.join(" ");
        (lo <= addr && addr < hi && path.starts_with('/') && !path.ends_with(" (deleted)"))
            .then(|| (PathBuf::from(path), addr - lo + off))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_that_holds_an_address_gives_its_file_offset() {
        let maps = "\
5600aa000000-5600aa100000 r--p 00000000 fd:01 123 /usr/bin/retry agent
5600aa100000-5600aa900000 r-xp 00100000 fd:01 123 /usr/bin/retry agent
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 
7f0000001000-7f0000002000 r-xp 00002000 fd:01 9 /gone (deleted)
";
        assert_eq!(
            file_offset_in(maps, 0x5600_aa10_0010),
            Some((PathBuf::from("/usr/bin/retry agent"), 0x10_0010))
        );
        assert_eq!(file_offset_in(maps, 0x7f00_0000_0010), None, "anonymous");
        assert_eq!(file_offset_in(maps, 0x7f00_0000_1010), None, "deleted file");
        assert_eq!(file_offset_in(maps, 0x1000), None);
    }

    #[test]
    fn this_process_finds_its_own_calibration_function() {
        let (exe, off) =
            own_file_offset(retry_agent_uprobe_calibration as *const () as u64).unwrap();
        assert!(exe.is_file(), "{exe:?}");
        assert!(off > 0);
    }
}
