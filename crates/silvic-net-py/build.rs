//! Compiles the C++ half of the LightGBM network hooks (src/lightgbm_shim.cpp) into the module,
//! with the system C++ compiler. It links libstdc++ dynamically, as LightGBM's wheel does, so
//! the exception it throws is the one LightGBM's C API catches.

fn main() {
    println!("cargo:rerun-if-changed=src/lightgbm_shim.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(true)
        .extra_warnings(true)
        .file("src/lightgbm_shim.cpp")
        .compile("silvic_lightgbm_shim");
}
