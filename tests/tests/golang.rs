//! Go programs built here with the Go on this machine, with DWARF and stripped
//! (`-ldflags=-s -w`): the agent finds the functions its Go uprobes need in both, at the same
//! places, and their RET instructions.
use std::{path::PathBuf, process::Command};

use retry_agent::capture::golang::{GoBinary, GoError, GoVersion};

const WANTED: &[&str] = &[
    "net/http.serverHandler.ServeHTTP",
    "net/http.(*Transport).roundTrip",
    "net/http.(*Request).write",
    "runtime.newproc1",
    "runtime.goexit1",
];

/// Builds tests/fixtures/go/chain into a temporary directory; None (with the reason printed)
/// where no Go toolchain is installed.
fn build(ldflags: &str) -> Option<PathBuf> {
    if Command::new("go").arg("version").output().is_err() {
        eprintln!("SKIP: no Go toolchain (cargo xtask setup installs golang-go)");
        return None;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/go/chain");
    let dir = std::env::temp_dir().join(format!("retry-agent-go-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("main.go"), dir.join("main.go")).unwrap();
    std::fs::write(dir.join("go.mod"), "module chain\n\ngo 1.17\n").unwrap();
    let out = dir.join(if ldflags.is_empty() { "chain" } else { "chain-stripped" });
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .args(["-ldflags", ldflags, "."])
        .current_dir(&dir)
        .env("GOFLAGS", "-mod=mod")
        .env("CGO_ENABLED", "0")
        .status()
        .expect("go build runs");
    assert!(status.success(), "go build failed");
    Some(out)
}

#[test]
fn functions_and_returns_are_found_with_and_without_symbols() {
    let Some(full) = build("") else { return };
    let Some(stripped) = build("-s -w") else { return };
    let a = GoBinary::inspect(&full, WANTED).expect("a Go binary with symbols is read");
    let b = GoBinary::inspect(&stripped, WANTED).expect("a stripped Go binary is read");
    assert!(a.has_symbols, "{a}");
    assert!(!b.has_symbols, "{b}");
    assert!(a.version >= GoVersion::new(1, 17, 0));
    assert_eq!(a.version, b.version);
    for name in WANTED {
        assert!(a.has(name) && b.has(name), "{name} missing");
        let ea = a.entry_offset(name).unwrap();
        let eb = b.entry_offset(name).unwrap();
        assert!(ea > 0 && eb > 0);
        // Stripping keeps the code where it was: the same functions, the same returns.
        assert_eq!(ea, eb, "{name}: entry differs between symbol table and pclntab");
        let ra = a.return_offsets(name).unwrap();
        assert_eq!(ra, b.return_offsets(name).unwrap(), "{name}: RETs differ");
        assert!(ra.iter().all(|r| *r > ea), "{name}: a RET before the entry");
    }
    // The probed entry really is the function's first instruction: the bytes at the entry
    // offset of the stripped file equal those of the symbol-table file.
    let fa = std::fs::read(&full).unwrap();
    let fb = std::fs::read(&stripped).unwrap();
    let e = a.entry_offset("runtime.newproc1").unwrap() as usize;
    assert_eq!(fa[e..e + 16], fb[e..e + 16]);
    let _ = std::fs::remove_dir_all(full.parent().unwrap());
}

#[test]
fn a_program_that_is_not_go_is_reported_not_fatal() {
    let err = GoBinary::inspect(std::path::Path::new("/bin/sh"), WANTED).unwrap_err();
    assert!(matches!(err, GoError::NotGo), "{err}");
    let err = GoBinary::inspect(std::path::Path::new("/nonexistent/binary"), WANTED).unwrap_err();
    assert!(matches!(err, GoError::Io(_)), "{err}");
}
