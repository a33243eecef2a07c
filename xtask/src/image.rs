//! `cargo xtask image`: the agent as an OCI image, without a container daemon.
//!
//! The root filesystem is the release binary plus exactly the shared libraries `ldd` says it
//! loads (and the dynamic loader), nothing else: no shell, no package manager. The output is an
//! OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) packed as one tar, which
//! `ctr images import`, `skopeo copy oci-archive:…` and `umoci` read. Layers are uncompressed
//! tars with fixed owners and times, so the same binary gives the same digests.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{build, setup};

#[derive(Debug, Args)]
pub struct ImageArgs {
    /// Image tag (default: the workspace version).
    #[arg(long)]
    tag: Option<String>,
    /// Repository name the index records (what `ctr images import` names the image).
    #[arg(long, default_value = "docker.io/library/retry-agent")]
    name: String,
    /// Use this agent binary instead of building one.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Output file (default: target/image/retry-agent-<tag>.oci.tar).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: ImageArgs) -> Result<()> {
    let bin = match &args.binary {
        Some(b) => b.clone(),
        None => build::agent(true)?,
    };
    let tag = args
        .tag
        .clone()
        .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string());
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| setup::root().join(format!("target/image/retry-agent-{tag}.oci.tar")));
    let reference = format!("{}:{tag}", args.name);
    build_image(&bin, &reference, &tag, &out)?;
    println!("{}", out.display());
    Ok(())
}

/// Writes the OCI layout tar for `bin` to `out`, naming it `reference`.
pub fn build_image(bin: &Path, reference: &str, tag: &str, out: &Path) -> Result<()> {
    let mut files: Vec<(String, PathBuf, u32)> =
        vec![("usr/bin/retry-agent".into(), bin.to_path_buf(), 0o755)];
    for lib in shared_libraries(bin)? {
        let inside = lib.to_string_lossy().trim_start_matches('/').to_string();
        files.push((inside, lib, 0o755));
    }
    let layer = layer_tar(&files)?;
    let layer_digest = sha256(&layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": ["/usr/bin/retry-agent"],
            "Cmd": ["run"],
            "Env": ["RETRY_AGENT_LOG=info"],
            "Labels": {
                "org.opencontainers.image.title": "retry-agent",
                "org.opencontainers.image.version": tag,
            },
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
        "history": [{ "created_by": "cargo xtask image: the release binary and the shared libraries it loads" }],
    }))?;
    let config_digest = sha256(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{config_digest}"), "size": config.len() },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{layer_digest}"), "size": layer.len() }],
        "annotations": { "org.opencontainers.image.version": tag },
    }))?;
    let manifest_digest = sha256(&manifest);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": { "io.containerd.image.name": reference, "org.opencontainers.image.ref.name": tag },
        }],
    }))?;
    let mut outer = tar::Builder::new(Vec::new());
    append(
        &mut outer,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    )?;
    append(&mut outer, "index.json", &index, 0o644)?;
    append_dir(&mut outer, "blobs/")?;
    append_dir(&mut outer, "blobs/sha256/")?;
    for (digest, blob) in [
        (&layer_digest, &layer),
        (&config_digest, &config),
        (&manifest_digest, &manifest),
    ] {
        append(&mut outer, &format!("blobs/sha256/{digest}"), blob, 0o644)?;
    }
    let bytes = outer.into_inner()?;
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "xtask: image {reference} ({} files, layer {} bytes) → {}",
        files.len(),
        layer.len(),
        out.display()
    );
    Ok(())
}

/// The absolute paths of the libraries (and loader) `ldd` resolves for `bin`.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if text.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        bail!(
            "ldd {} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_ldd(&text)
}

/// `libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x…)` and `/lib64/ld-linux-x86-64.so.2
/// (0x…)`; `linux-vdso.so.1` is the kernel's and has no file.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            bail!("a shared library is missing: {line}");
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    libs.sort();
    libs.dedup();
    Ok(libs)
}

/// One layer: every parent directory, then each file (symlinks followed: the loader only needs
/// the name `ldd` printed).
fn layer_tar(files: &[(String, PathBuf, u32)]) -> Result<Vec<u8>> {
    let mut dirs: Vec<String> = files
        .iter()
        .flat_map(|(inside, _, _)| {
            let parts: Vec<&str> = inside.split('/').collect();
            (1..parts.len())
                .map(move |n| format!("{}/", parts[..n].join("/")))
                .collect::<Vec<_>>()
        })
        .collect();
    // Mount points the manifests use must exist in a read-only root filesystem.
    dirs.extend(
        [
            "tmp/",
            "run/",
            "run/retry-agent/",
            "var/",
            "var/lib/",
            "var/lib/retry-agent/",
        ]
        .map(String::from),
    );
    dirs.sort();
    dirs.dedup();
    let mut b = tar::Builder::new(Vec::new());
    for d in &dirs {
        append_dir(&mut b, d)?;
    }
    for (inside, src, mode) in files {
        let data = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        append(&mut b, inside, &data, *mode)?;
    }
    Ok(b.into_inner()?)
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn append(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) -> Result<()> {
    let mut h = header(tar::EntryType::Regular, data.len() as u64, mode);
    b.append_data(&mut h, path, data)
        .with_context(|| format!("adding {path}"))
}

fn append_dir(b: &mut tar::Builder<Vec<u8>>, path: &str) -> Result<()> {
    let mut h = header(tar::EntryType::Directory, 0, 0o755);
    b.append_data(&mut h, path, std::io::empty())
        .with_context(|| format!("adding {path}"))
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_library_paths_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x00007f1)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        let libs = parse_ldd(text).unwrap();
        assert_eq!(
            libs,
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib/x86_64-linux-gnu/libssl.so.3",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }
}
