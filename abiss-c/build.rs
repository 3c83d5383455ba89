//! Gives `libabiss.so` its SONAME, `libabiss.so.0`: programs linked against it record that
//! name, so an installed `libabiss.so.0.x.y` can be replaced by a compatible one without
//! relinking, and an incompatible one (a new major) can be installed beside it.
fn main() {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libabiss.so.{major}");
}
