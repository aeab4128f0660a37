//! Compiles every .proto under proto/ with a vendored protoc, so a fresh machine
//! needs nothing but cargo. Only the server speaks protobuf: the library-only
//! build (`default-features = false`) skips this and its build dependencies.

#[cfg(feature = "server")]
use std::path::{Path, PathBuf};

#[cfg(feature = "server")]
fn protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(not(feature = "server"))]
fn main() {}

#[cfg(feature = "server")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let mut files = Vec::new();
    protos(Path::new("proto"), &mut files)?;
    files.sort();
    println!("cargo:rerun-if-changed=proto");
    // Undecodable requests are INVALID_ARGUMENT, not tonic's INTERNAL (src/proto/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::proto::codec::StrictCodec")
        .compile_protos(&files, &[PathBuf::from("proto")])?;
    Ok(())
}
