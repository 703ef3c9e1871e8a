//! Links the guest program with `link.ld` (only for the bare-metal target).
//!
//! The script is copied into `OUT_DIR` and linked from there, not from the source tree: the
//! guest's cargo target directory is shared by every clone that builds it
//! (`resources/build-guest.sh` keeps it in the artefact cache), and cargo does not rerun a
//! build script just because the same package now lives at another path, so a
//! source-tree path recorded by one clone would dangle once that clone is gone.

fn main() {
    println!("cargo:rerun-if-changed=link.ld");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("none") {
        let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
        let script = std::path::Path::new(&out).join("link.ld");
        std::fs::copy("link.ld", &script).expect("copy link.ld into OUT_DIR");
        println!("cargo:rustc-link-arg-bins=-T{}", script.display());
        println!("cargo:rustc-link-arg-bins=--no-pie");
    }
}
