//! Finds libflashspec without any crate: FLASHSPEC_LIB_DIR if set, else the
//! `pkg-config` program (PKG_CONFIG_PATH may point at a build tree's
//! meson-uninstalled directory). Dependents get DEP_FLASHSPEC_LIB_DIR.
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=FLASHSPEC_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");
    let dirs: Vec<String> = match env::var("FLASHSPEC_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => vec![dir],
        _ => pkg_config_lib_dirs(),
    };
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={dir}");
    }
    if let Some(dir) = dirs.first() {
        println!("cargo:lib_dir={dir}");
    }
    println!("cargo:rustc-link-lib=dylib=flashspec");
}

fn pkg_config_lib_dirs() -> Vec<String> {
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let output = Command::new(&program).args(["--libs", "flashspec"]).output();
    match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|flag| flag.strip_prefix("-L").map(str::to_owned))
            .collect(),
        Ok(out) => panic!(
            "`{program} --libs flashspec` failed: {}\nset FLASHSPEC_LIB_DIR or PKG_CONFIG_PATH",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("cannot run `{program}` ({e}); set FLASHSPEC_LIB_DIR to the directory of libflashspec.so"),
    }
}
