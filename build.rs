//! Build metadata for `prefix_picker_build_info` and the start-up line: the git revision, from
//! `PREFIX_PICKER_REVISION` when set (image builds without a repository), else `git`, else
//! `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PREFIX_PICKER_REVISION");
    for path in [".git/HEAD", ".git/refs/heads"] {
        if Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let revision = std::env::var("PREFIX_PICKER_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
                .filter(|r| !r.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=PREFIX_PICKER_REVISION={revision}");
}
