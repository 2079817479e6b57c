//! Generates the libfabric bindings from the system's public headers
//! (Debian 12: `apt-get install libfabric-dev libclang-dev`). Nothing of
//! the headers is kept in the repository.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=LIBFABRIC_INCLUDE_DIR");
    let include = std::env::var("LIBFABRIC_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".into());
    let header = Path::new(&include).join("rdma/providers/fi_prov.h");
    // Rerun when the headers appear, change or go.
    println!("cargo:rerun-if-changed={}", header.display());
    if !header.exists() {
        panic!(
            "\n\nmetaroce-fi needs libfabric's development headers ({} not found).\n\
             On Debian 12: apt-get install -y libfabric-dev libclang-dev\n\
             (or set LIBFABRIC_INCLUDE_DIR to the directory holding rdma/).\n\
             The rest of the workspace builds without them: this crate is not a default member.\n",
            header.display()
        );
    }
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{include}"))
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*|FID_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "\n\nmetaroce-fi: generating the libfabric bindings failed: {e}\n\
                 bindgen needs libclang (Debian: apt-get install -y libclang-dev).\n"
            )
        });
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("libfabric.rs"))
        .expect("write bindings");
    // The provider calls the core's exported helpers (fi_log, fi_param_*,
    // fi_dupinfo): libfabric loads the provider into a process that has
    // them, so link against it for the symbols' versions.
    println!("cargo:rustc-link-lib=dylib=fabric");
}
