//! The picker config file a suite row takes its routing from: the shipped default
//! (`deploy/local/config.yaml`), or a user's file (`prefix-bench suite --config FILE`) for the
//! shipped-config rows.
//!
//! Only two parts of the file are used: its `scheduler:` section and its `picker.affinity`
//! mapping. The suite writes the rest of each row's config itself (its sims as static
//! endpoints, the scrape interval, an engine-events row's `picker.tokenizer`). The whole file
//! is validated first, as `prefix-picker validate` does, so a typo is refused before any
//! process starts, with the file's name in the error.

use std::path::{Path, PathBuf};

use prefix_picker::config::Config;
use serde_yaml_ng::{Mapping, Value};

/// A config file that cannot drive a row.
#[derive(Debug, thiserror::Error)]
pub enum RowConfigError {
    #[error("cannot read the picker config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the picker config {path} does not validate:\n{errors}")]
    Invalid { path: PathBuf, errors: String },
}

/// The routing a row takes from a config file.
#[derive(Debug, Clone, PartialEq)]
pub struct RowConfig {
    /// The file it came from.
    pub path: PathBuf,
    /// Its `scheduler:` section alone, as YAML text (empty mapping when it has none).
    pub scheduler: String,
    /// Its `picker.affinity` mapping, as JSON (which YAML reads as a flow mapping).
    pub affinity: Option<serde_json::Value>,
}

impl RowConfig {
    /// Reads and validates `path` (every error of `prefix-picker validate`, named by the file).
    pub fn load(path: &Path) -> Result<RowConfig, RowConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| RowConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |errors: String| RowConfigError::Invalid {
            path: path.to_path_buf(),
            errors,
        };
        Config::parse(&text).map_err(|e| invalid(e.to_string()))?;
        let doc: Value = serde_yaml_ng::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let mut only = Mapping::new();
        if let Some(s) = doc.get("scheduler") {
            only.insert("scheduler".into(), s.clone());
        }
        let scheduler = serde_yaml_ng::to_string(&only).map_err(|e| invalid(e.to_string()))?;
        let affinity = doc
            .get("picker")
            .and_then(|p| p.get("affinity"))
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(RowConfig {
            path: path.to_path_buf(),
            scheduler,
            affinity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mine.yaml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn the_scheduler_section_and_the_affinity_mapping_are_taken() {
        let (_dir, path) = file(
            "scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: prefix-cache, weight: 2}\n\
             picker:\n  scrapeIntervalSeconds: 1\n  affinity: {tentative: false}\n",
        );
        let c = RowConfig::load(&path).unwrap();
        assert_eq!(c.path, path);
        let scheduler: Value = serde_yaml_ng::from_str(&c.scheduler).unwrap();
        assert_eq!(
            scheduler["scheduler"]["plugins"]["Score"]["enabled"][0]["weight"].as_i64(),
            Some(2)
        );
        assert_eq!(scheduler.as_mapping().unwrap().len(), 1);
        assert_eq!(c.affinity, Some(serde_json::json!({"tentative": false})));
    }

    #[test]
    fn the_shipped_config_loads_with_its_affinity() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local/config.yaml");
        let c = RowConfig::load(&path).unwrap();
        assert!(c.scheduler.contains("prefix-cache"), "{}", c.scheduler);
        assert!(c.affinity.is_some());
    }

    #[test]
    fn a_file_that_does_not_validate_is_refused_by_name() {
        for (text, says) in [
            ("scheduler: [\n", "YAML"),
            ("picker:\n  affinity: {tentativ: true}\n", "tentativ"),
            (
                "picker:\n  scrapeIntervalSeconds: -1\n",
                "scrapeIntervalSeconds",
            ),
        ] {
            let (_dir, path) = file(text);
            let err = RowConfig::load(&path).unwrap_err().to_string();
            assert!(err.contains(&path.display().to_string()), "{err}");
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = RowConfig::load(Path::new("/nonexistent/picker.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/picker.yaml"), "{err}");
    }
}
