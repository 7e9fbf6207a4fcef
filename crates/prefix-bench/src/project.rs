//! Where the bench finds the project it measures: the checkout's root (`PREFIX_PICKER_ROOT`),
//! Envoy (`ENVOY_BIN`), and the shipped default config.

use std::path::PathBuf;

use super::row_config::RowConfig;

/// Project root: `$PREFIX_PICKER_ROOT`, else the current directory.
pub fn root() -> PathBuf {
    std::env::var_os("PREFIX_PICKER_ROOT").map_or_else(|| PathBuf::from("."), PathBuf::from)
}

/// Envoy: `$ENVOY_BIN`, else `.venv/bin/envoy` under the root.
pub fn envoy_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Ok(p.into());
    }
    let venv = root().join(".venv/bin/envoy");
    anyhow::ensure!(
        venv.exists(),
        "Envoy not found: set ENVOY_BIN or run scripts/test once"
    );
    Ok(venv)
}

/// The shipped default config (`deploy/local/config.yaml`), validated.
pub fn shipped_config() -> anyhow::Result<RowConfig> {
    Ok(RowConfig::load(&root().join("deploy/local/config.yaml"))?)
}

/// The `scheduler:` section of the shipped default config (Kthena's Helm
/// `routerConfiguration`), alone.
pub fn default_scheduler() -> anyhow::Result<String> {
    Ok(shipped_config()?.scheduler)
}
