use super::{buildinfo::GoVersion, pclntab, ret_addresses};

#[test]
fn versions_parse_and_order() {
    assert_eq!(GoVersion::parse("go1.19.8"), Some(GoVersion::new(1, 19, 8)));
    assert_eq!(
        GoVersion::parse("go1.21rc2"),
        Some(GoVersion::new(1, 21, 0))
    );
    assert_eq!(GoVersion::parse("go1.22"), Some(GoVersion::new(1, 22, 0)));
    assert_eq!(
        GoVersion::parse("devel go1.23-abc123 Tue"),
        Some(GoVersion::new(1, 23, 0))
    );
    assert_eq!(GoVersion::parse("1.19"), None);
    assert_eq!(GoVersion::parse("go"), None);
    assert!(GoVersion::new(1, 16, 15) < GoVersion::new(1, 17, 0));
    assert_eq!(GoVersion::new(1, 19, 8).to_string(), "go1.19.8");
}

/// A go1.18+ table with three functions: `a` at text+0x10, `net/http.x` at +0x40, `b` at
/// +0x90, end at +0xa0.
fn table_118() -> Vec<u8> {
    let text_start: u64 = 0x40_1000;
    let mut t = vec![0u8; 8 + 8 * 8];
    t[..4].copy_from_slice(&0xffff_fff1u32.to_le_bytes());
    t[6] = 1; // min instruction size
    t[7] = 8; // pointer size
    let names = b"a\0net/http.x\0b\0";
    let funcnames = t.len();
    t.extend_from_slice(names);
    let pcln = t.len();
    let funcs = [(0x10u32, 0usize), (0x40, 2), (0x90, 13)];
    let functab_len = (funcs.len() + 1) * 8;
    let mut functab = Vec::new();
    let mut func_structs = Vec::new();
    for (entry, name_off) in funcs {
        let func_off = functab_len + func_structs.len();
        functab.extend_from_slice(&entry.to_le_bytes());
        functab.extend_from_slice(&(func_off as u32).to_le_bytes());
        func_structs.extend_from_slice(&entry.to_le_bytes());
        func_structs.extend_from_slice(&(name_off as i32).to_le_bytes());
    }
    functab.extend_from_slice(&0xa0u32.to_le_bytes());
    functab.extend_from_slice(&0u32.to_le_bytes());
    t.extend_from_slice(&functab);
    t.extend_from_slice(&func_structs);
    let words = [
        funcs.len() as u64,
        0,
        text_start,
        funcnames as u64,
        0,
        0,
        0,
        pcln as u64,
    ];
    for (i, w) in words.iter().enumerate() {
        t[8 + i * 8..16 + i * 8].copy_from_slice(&w.to_le_bytes());
    }
    t
}

#[test]
fn pclntab_finds_functions_by_name_with_their_end() {
    let t = table_118();
    let found = pclntab::lookup(&t, &["net/http.x", "b", "absent"]).unwrap();
    assert_eq!(
        found["net/http.x"],
        super::FuncRange {
            entry: 0x40_1040,
            end: 0x40_1090
        }
    );
    assert_eq!(
        found["b"],
        super::FuncRange {
            entry: 0x40_1090,
            end: 0x40_10a0
        }
    );
    assert!(!found.contains_key("absent"));
}

#[test]
fn pclntab_errors_instead_of_panicking_on_damage() {
    let t = table_118();
    assert!(pclntab::lookup(&[], &["a"]).is_err());
    let mut bad = t.clone();
    bad[0] = 0;
    assert!(pclntab::lookup(&bad, &["a"]).is_err(), "unknown magic");
    // Every truncation is an error or a partial answer, never a panic.
    for cut in 0..t.len() {
        let _ = pclntab::lookup(&t[..cut], &["a", "b", "net/http.x"]);
    }
    // Every single-byte corruption likewise.
    for i in 0..t.len() {
        let mut c = t.clone();
        c[i] ^= 0xff;
        let _ = pclntab::lookup(&c, &["a", "b", "net/http.x"]);
    }
}

#[test]
fn returns_are_found_by_decoding_not_by_byte_search() {
    // mov eax, 0xc3 (b8 c3 00 00 00): a C3 byte that is not a RET; then ret; int3; ret imm16.
    let body = [0xb8, 0xc3, 0x00, 0x00, 0x00, 0xc3, 0xcc, 0xc2, 0x08, 0x00];
    assert_eq!(ret_addresses(&body, 0x1000), vec![0x1005, 0x1007]);
    assert!(ret_addresses(&[0x90, 0x90], 0x1000).is_empty());
}

#[test]
fn non_go_files_are_said_to_be_so() {
    let err = super::GoBinary::parse(&b"not an elf"[..], &["x"]).unwrap_err();
    assert!(matches!(err, super::GoError::Elf(_)), "{err}");
    // The test binary itself is an ELF, but not a Go program.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let err = super::GoBinary::parse(&me[..], &["x"]).unwrap_err();
    assert!(matches!(err, super::GoError::NotGo), "{err}");
}

#[test]
fn grpc_release_is_read_from_the_user_agent_literal() {
    use super::grpc::parse_release;
    assert_eq!(parse_release(b"1.33.3"), Some((1, 33)));
    // The literal runs on into the next string's bytes.
    assert_eq!(parse_release(b"1.60.12006-01-02"), Some((1, 60)));
    assert_eq!(parse_release(b"1.33"), None);
    assert_eq!(parse_release(b"1.3312345"), None);
    assert_eq!(parse_release(b"x.33.1"), None);
    assert_eq!(parse_release(b""), None);
    assert_eq!(parse_release(b"99999.1.1"), None);
}
