//! With the `isal` feature: generates Rust bindings for the erasure-code calls of the
//! system's ISA-L (`isa-l/erasure_code.h`, libisal-dev) and links libisal. Without the
//! feature it does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "isal")]
    isal::build();
}

#[cfg(feature = "isal")]
mod isal {
    use std::path::PathBuf;

    pub(super) fn build() {
        let bindings = bindgen::Builder::default()
            .header_contents("isal.h", "#include <isa-l/erasure_code.h>\n")
            .allowlist_function("ec_init_tables")
            .allowlist_function("ec_encode_data")
            .allowlist_function("gf_gen_cauchy1_matrix")
            .allowlist_function("gf_invert_matrix")
            // ISA-L's comments are C documentation, not doctests.
            .generate_comments(false)
            .generate()
            .expect("bindgen could not read isa-l/erasure_code.h; install libisal-dev");
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
        bindings
            .write_to_file(out.join("isal_bindings.rs"))
            .expect("write the ISA-L bindings");
        println!("cargo:rustc-link-lib=isal");
    }
}
