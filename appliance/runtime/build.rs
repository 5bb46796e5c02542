//! Links libexanic statically for the `exanic` feature, from the folder `EXANIC_LIB_DIR`
//! names (a `libexanic.a` built from Cisco exanic-software, e.g. with musl-gcc; ADR 0021).
//! Without it nothing is linked: the runtime's own tests provide the symbols from the test
//! double (`appliance/exanic-double`), and a binary built that way fails to link, by design.

fn main() {
    println!("cargo:rerun-if-env-changed=EXANIC_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_EXANIC").is_none() {
        return;
    }
    match std::env::var("EXANIC_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=static=exanic");
        }
        _ => println!(
            "cargo:warning=feature exanic without EXANIC_LIB_DIR: libexanic is not linked \
             (the runtime's tests link the test double instead)"
        ),
    }
}
