//! Builds the dashboard's browser half so that a plain `cargo build` of the
//! server is enough: this crate again, for wasm32 with the `hydrate`
//! feature (a nested cargo in its own target directory, so the two builds
//! never wait on each other's lock), then wasm-bindgen as a library (the
//! very version `Cargo.lock` pins for the crate), then gzip. The server
//! embeds the results from `OUT_DIR` (`server::assets`).
//!
//! `BATON_WEB_WASM_TARGET_DIR` names that target directory (default
//! `web-wasm` in the outer one): a build for another target, such as the
//! image's musl build in a directory of its own, can share the browser half
//! the host build made rather than compile it again.
//!
//! `BATON_WEB_SKIP_WASM=1` skips it: the pages still render and work
//! without JavaScript, and the page says the live updates are off.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The names `leptos`' hydration script asks for (`LeptosOptions::output_name`).
const OUTPUT_NAME: &str = "baton-web";
const WASM_TARGET: &str = "wasm32-unknown-unknown";
const PROFILE: &str = "wasm-release";

fn main() {
    println!("cargo:rerun-if-env-changed=BATON_WEB_SKIP_WASM");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = std::env::var("TARGET").unwrap_or_default();
    let server_build = std::env::var_os("CARGO_FEATURE_SSR").is_some();
    // The wasm build itself, and builds without the server, embed nothing.
    if target == WASM_TARGET || !server_build {
        return;
    }
    let skip = std::env::var("BATON_WEB_SKIP_WASM").is_ok_and(|v| v == "1");
    if skip {
        write_assets(&out_dir, None);
        return;
    }

    let crate_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = crate_dir
        .parent()
        .expect("web/ sits in the workspace")
        .to_owned();
    for watched in ["src", "Cargo.toml"] {
        println!(
            "cargo:rerun-if-changed={}",
            crate_dir.join(watched).display()
        );
    }
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("crates/baton-views/src").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );

    println!("cargo:rerun-if-env-changed=BATON_WEB_WASM_TARGET_DIR");
    let target_dir = match std::env::var_os("BATON_WEB_WASM_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"))
            .join("web-wasm"),
    };
    let wasm = build_wasm(&workspace, &target_dir);
    let (js, wasm) = bindgen(&wasm);
    write_assets(&out_dir, Some((js, wasm)));
}

/// `cargo build` of this crate's library for the browser.
fn build_wasm(workspace: &Path, target_dir: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .args(["build", "--package", "baton-web", "--lib"])
        .args(["--target", WASM_TARGET, "--profile", PROFILE])
        .args(["--no-default-features", "--features", "hydrate"])
        .arg("--target-dir")
        .arg(target_dir);
    // What the outer build set for itself must not leak into this one
    // (clippy's wrapper, flags for the host, the outer build's target).
    for var in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_MAKEFLAGS",
    ] {
        command.env_remove(var);
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("baton-web: could not run cargo for the wasm32 build: {e}"));
    assert!(
        status.success(),
        "baton-web: the wasm32 build of the dashboard failed (see above). It needs the \
         {WASM_TARGET} target (`rustup target add {WASM_TARGET}`; rust-toolchain.toml lists it); \
         BATON_WEB_SKIP_WASM=1 builds the server without it"
    );
    target_dir
        .join(WASM_TARGET)
        .join(PROFILE)
        .join("baton_web.wasm")
}

/// The JS glue and the final wasm, as `wasm-bindgen --target web` writes them.
fn bindgen(wasm: &Path) -> (Vec<u8>, Vec<u8>) {
    let mut output = wasm_bindgen_cli_support::Bindgen::new()
        .input_path(wasm)
        .out_name(OUTPUT_NAME)
        .web(true)
        .expect("--target web is a valid wasm-bindgen mode")
        .typescript(false)
        .remove_name_section(true)
        .remove_producers_section(true)
        .generate_output()
        .unwrap_or_else(|e| panic!("baton-web: wasm-bindgen on {}: {e:#}", wasm.display()));
    let js = output.js().as_bytes().to_vec();
    let wasm = output.wasm_mut().emit_wasm();
    (js, wasm)
}

/// `OUT_DIR/assets.rs` names the files (or says there are none).
fn write_assets(out_dir: &Path, built: Option<(Vec<u8>, Vec<u8>)>) {
    let mut index = String::new();
    match built {
        Some((js, wasm)) => {
            for (name, bytes) in [
                (format!("{OUTPUT_NAME}.js"), js),
                (format!("{OUTPUT_NAME}_bg.wasm"), wasm),
            ] {
                std::fs::write(out_dir.join(&name), &bytes).expect("write asset");
                std::fs::write(out_dir.join(format!("{name}.gz")), gzip(&bytes))
                    .expect("write gzipped asset");
            }
            index.push_str("pub const HYDRATES: bool = true;\n");
            for (constant, name) in [
                ("JS", format!("{OUTPUT_NAME}.js")),
                ("WASM", format!("{OUTPUT_NAME}_bg.wasm")),
            ] {
                index.push_str(&format!(
                    "pub const {constant}: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}\"));\n\
                     pub const {constant}_GZ: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}.gz\"));\n"
                ));
            }
        }
        None => {
            index.push_str(
                "pub const HYDRATES: bool = false;\npub const JS: &[u8] = b\"\";\npub const JS_GZ: &[u8] = b\"\";\n\
                 pub const WASM: &[u8] = b\"\";\npub const WASM_GZ: &[u8] = b\"\";\n",
            );
        }
    }
    std::fs::write(out_dir.join("assets.rs"), index).expect("write assets.rs");
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).expect("gzip in memory");
    encoder.finish().expect("gzip in memory")
}
