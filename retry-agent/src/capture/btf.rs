//! Kernel struct offsets from BTF (/sys/kernel/btf/vmlinux). Aya emits no CO-RE relocations, so
//! the one field the programs read (`struct sock.sk_err`, the errno of a failed connect or reset)
//! gets its offset here, as do the links from a task to the socket behind an fd, and they are
//! handed to the kernel through `Config`.
//!
//! A minimal reader: walks the type section once, understands only what is needed to find a
//! member's byte offset (including through anonymous structs/unions). Never panics on bad input.

pub use retry_common::KernelOffsets;

/// Reads /sys/kernel/btf/vmlinux once.
pub fn kernel_offsets() -> KernelOffsets {
    let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
        tracing::warn!(
            "no kernel BTF at /sys/kernel/btf/vmlinux: connect-failure errnos and accept(NULL) unavailable"
        );
        return KernelOffsets::default();
    };
    offsets_from(&data)
}

pub fn offsets_from(data: &[u8]) -> KernelOffsets {
    let Some(btf) = Parsed::new(data) else {
        tracing::warn!("kernel BTF unreadable");
        return KernelOffsets::default();
    };
    let get = |s: &str, m: &str| {
        let o = btf.member_offset(s, m);
        if o.is_none() {
            tracing::warn!(strukt = s, member = m, "member not found in kernel BTF");
        }
        o.unwrap_or(0)
    };
    let mut o = KernelOffsets {
        sk_err: get("sock", "sk_err"),
        task_files: get("task_struct", "files"),
        files_fdt: get("files_struct", "fdt"),
        fdt_fd: get("fdtable", "fd"),
        file_private_data: get("file", "private_data"),
        socket_sk: get("socket", "sk"),
        task_mm: get("task_struct", "mm"),
        mm_exe_file: get("mm_struct", "exe_file"),
        file_inode: get("file", "f_inode"),
        inode_ino: get("inode", "i_ino"),
        inode_sb: get("inode", "i_sb"),
        sb_dev: get("super_block", "s_dev"),
        task_nsproxy: get("task_struct", "nsproxy"),
        nsproxy_net_ns: get("nsproxy", "net_ns"),
        net_ns: get("net", "ns"),
        ns_inum: get("ns_common", "inum"),
    };
    // Each walk needs every link; a partial set would read the wrong memory.
    let fd_walk = [
        o.task_files,
        o.files_fdt,
        o.fdt_fd,
        o.file_private_data,
        o.socket_sk,
    ];
    if fd_walk.contains(&0) {
        o = KernelOffsets {
            task_files: 0,
            files_fdt: 0,
            fdt_fd: 0,
            file_private_data: 0,
            socket_sk: 0,
            ..o
        };
    }
    let exe_walk = [
        o.task_mm,
        o.mm_exe_file,
        o.file_inode,
        o.inode_ino,
        o.inode_sb,
        o.sb_dev,
    ];
    if exe_walk.contains(&0) {
        o = KernelOffsets {
            task_mm: 0,
            mm_exe_file: 0,
            file_inode: 0,
            inode_ino: 0,
            inode_sb: 0,
            sb_dev: 0,
            ..o
        };
    }
    // `net.ns` may well be at offset 0; the other three links never are.
    let netns_walk = [o.task_nsproxy, o.nsproxy_net_ns, o.ns_inum];
    if netns_walk.contains(&0) {
        o = KernelOffsets {
            task_nsproxy: 0,
            nsproxy_net_ns: 0,
            net_ns: 0,
            ns_inum: 0,
            ..o
        };
    }
    o
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

struct Type {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    /// Offset of the first member record (struct/union), in the type section.
    members_at: usize,
    vlen: usize,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn str_at(strings: &[u8], off: u32) -> Option<&str> {
    let s = strings.get(off as usize..)?;
    let end = s.iter().position(|&c| c == 0)?;
    std::str::from_utf8(&s[..end]).ok()
}

/// A walked type section.
struct Parsed<'a> {
    all: Vec<Type>,
    types: &'a [u8],
    strings: &'a [u8],
}

impl<'a> Parsed<'a> {
    fn new(btf: &'a [u8]) -> Option<Parsed<'a>> {
        if btf.get(0..2)? != [0x9f, 0xeb] {
            return None;
        }
        let hdr_len = u32_at(btf, 4)? as usize;
        let type_off = u32_at(btf, 8)? as usize;
        let type_len = u32_at(btf, 12)? as usize;
        let str_off = u32_at(btf, 16)? as usize;
        let str_len = u32_at(btf, 20)? as usize;
        let types = btf.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
        let strings = btf.get(hdr_len + str_off..hdr_len + str_off + str_len)?;

        // Type ids start at 1; index 0 is the void placeholder.
        let mut all: Vec<Type> = vec![Type {
            name_off: 0,
            kind: 0,
            kind_flag: false,
            members_at: 0,
            vlen: 0,
        }];
        let mut at = 0usize;
        while at + 12 <= types.len() {
            let name_off = u32_at(types, at)?;
            let info = u32_at(types, at + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = match kind {
                1 | 14 | 17 => 4,     // INT, VAR, DECL_TAG
                3 => 12,              // ARRAY
                4 | 5 => vlen * 12,   // STRUCT, UNION
                6 | 13 => vlen * 8,   // ENUM, FUNC_PROTO
                15 | 19 => vlen * 12, // DATASEC, ENUM64
                2 | 7..=12 | 16 | 18 => 0,
                _ => return None,
            };
            all.push(Type {
                name_off,
                kind,
                kind_flag: info >> 31 == 1,
                members_at: at + 12,
                vlen,
            });
            at += 12 + extra;
        }
        Some(Parsed {
            all,
            types,
            strings,
        })
    }

    fn member_offset(&self, strukt: &str, member: &str) -> Option<u32> {
        // The first complete definition (vmlinux has one per name; forward decls are FWD).
        let id = self.all.iter().position(|t| {
            t.kind == KIND_STRUCT && t.vlen > 0 && str_at(self.strings, t.name_off) == Some(strukt)
        })?;
        find_member(&self.all, self.types, self.strings, id, member, 0)
    }
}

/// Byte offset of `member` in the struct named `strukt` (little-endian BTF).
#[cfg(test)]
fn member_offset(btf: &[u8], strukt: &str, member: &str) -> Option<u32> {
    Parsed::new(btf)?.member_offset(strukt, member)
}

fn find_member(
    all: &[Type],
    types: &[u8],
    strings: &[u8],
    id: usize,
    member: &str,
    depth: u32,
) -> Option<u32> {
    let t = all.get(id)?;
    if depth > 8 || (t.kind != KIND_STRUCT && t.kind != KIND_UNION) {
        return None;
    }
    for i in 0..t.vlen {
        let m = t.members_at + i * 12;
        let name_off = u32_at(types, m)?;
        let ty = u32_at(types, m + 4)? as usize;
        let raw_off = u32_at(types, m + 8)?;
        let bits = if t.kind_flag {
            raw_off & 0x00ff_ffff
        } else {
            raw_off
        };
        if name_off == 0 {
            if let Some(inner) = find_member(all, types, strings, ty, member, depth + 1) {
                return Some(bits / 8 + inner);
            }
        } else if str_at(strings, name_off) == Some(member) {
            return Some(bits / 8);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob: INT(id 1), STRUCT inner anon { int y @ 4 bytes } (id 2),
    /// STRUCT sock { int a @0; anon @8; int sk_err @16 } (id 3).
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0sock\0a\0sk_err\0y\0".to_vec();
        let (int, sock, a, sk_err, y) = (1u32, 5u32, 10u32, 12u32, 19u32);
        let mut types = Vec::new();
        let mut push = |v: &[u32]| {
            v.iter()
                .for_each(|x| types.extend_from_slice(&x.to_le_bytes()))
        };
        push(&[int, 1 << 24, 4, 32]);
        push(&[0, (4 << 24) | 1, 8, y, 1, 32]);
        push(&[sock, (4 << 24) | 3, 24, a, 1, 0, 0, 2, 64, sk_err, 1, 128]);
        let mut out = Vec::new();
        out.extend_from_slice(&[0x9f, 0xeb, 1, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn finds_direct_and_anonymous_members() {
        let b = blob();
        assert_eq!(member_offset(&b, "sock", "sk_err"), Some(16));
        assert_eq!(member_offset(&b, "sock", "a"), Some(0));
        assert_eq!(member_offset(&b, "sock", "y"), Some(12));
        assert_eq!(member_offset(&b, "sock", "nope"), None);
        assert_eq!(member_offset(&b, "task_struct", "pid"), None);
    }

    #[test]
    fn truncated_or_garbage_is_none() {
        let b = blob();
        for cut in 0..b.len() {
            let _ = member_offset(&b[..cut], "sock", "sk_err");
        }
        assert_eq!(member_offset(b"garbage", "sock", "sk_err"), None);
    }

    #[test]
    fn running_kernel_has_every_offset() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            eprintln!("skip: no kernel BTF");
            return;
        }
        let o = kernel_offsets();
        assert!(o.sk_err > 0 && o.sk_err < 2048, "{o:?}");
        // Every link of the fd walk, at plausible places.
        for v in [
            o.task_files,
            o.files_fdt,
            o.fdt_fd,
            o.file_private_data,
            o.socket_sk,
        ] {
            assert!(v > 0 && v < 16384, "{o:?}");
        }
        assert_eq!(o.fdt_fd % 8, 0, "pointer member is aligned: {o:?}");
        // Every link of the exe-file walk.
        for v in [
            o.task_mm,
            o.mm_exe_file,
            o.file_inode,
            o.inode_ino,
            o.inode_sb,
            o.sb_dev,
        ] {
            assert!(v > 0 && v < 16384, "{o:?}");
        }
        // The netns walk (net.ns may be first).
        for v in [o.task_nsproxy, o.nsproxy_net_ns, o.ns_inum] {
            assert!(v > 0 && v < 16384, "{o:?}");
        }
        assert!(o.net_ns < 16384, "{o:?}");
    }
}
