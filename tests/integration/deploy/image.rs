//! The container images, checked without a container runtime: those of `scripts/image` (the kind
//! recipe's) and those the `Dockerfile` builds. A `scripts/image` test assembles its image from
//! the binary this test run built (`scripts/image --binary`: the release images' layout, files and
//! config, from a debug build); a Dockerfile test opens the archive `scripts/dockerfile` wrote
//! (buildah, no daemon, on stand-in base images: `DOCKERFILE_IMAGES`, else
//! `$CARGO_TARGET_DIR/dockerfile`; scripts/test builds them first), whose binary is the Dockerfile's
//! release build of this commit. Each reads the image's config back through skopeo
//! (containers/image, what `skopeo copy` to a registry reads), unpacks it with umoci, and runs the
//! entrypoint chrooted into the rootfs as the image's user (65532:65532: the test must run as
//! root, as CI does; it fails otherwise). The chart (and the kind recipe's model-sim Deployment)
//! must agree with both images: entrypoint (no `command`), user, ports; the `scripts/image` ones
//! also carry the name and tag the chart and the recipe use, and the Dockerfile's the config of
//! the `scripts/image` ones.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value as Json;
use serde_yaml_ng::Value;
use tokio::io::AsyncBufReadExt;

use super::{documents, render_chart, show};
use crate::harness::fake_kube::{self, FakeKube, Kind};
use crate::harness::{poll, root};

/// The name `scripts/image` gives the picker image (model-sim: the same path ending in
/// `model-sim`). The chart has no default image until a release is published; deploy_check.py
/// renders every scenario with this name (`LOCAL_IMAGE`), as docs/kind.md installs it.
const LOCAL_REPOSITORY: &str = "ghcr.io/prefix-picker/prefix-picker";

/// Fails (never skips) unless the test runs as root: only root can chroot and switch to 65532.
fn require_root() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .unwrap();
    assert_eq!(
        euid, "0",
        "the image tests chroot into the image as uid 65532, which needs root: run scripts/test \
         as root (CI does)"
    );
}

/// `name` on PATH, or a failure that says how to get it.
fn tool(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("{name} not found: run scripts/test (scripts/tools.sh ensure_image_tools installs it)")
        })
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?} failed:\n{}", show(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// An image archive, read back and unpacked.
struct Image {
    dir: tempfile::TempDir,
    /// `io.containerd.image.name` of the archive's index (what kind and containerd tag it as):
    /// `scripts/image` names its images, the Dockerfile's are named by whoever builds them.
    name: Option<String>,
    /// The tag (`org.opencontainers.image.ref.name`).
    tag: String,
    /// The OCI image config, as skopeo reads it.
    config: Json,
}

impl Image {
    /// The image `scripts/image --binary` assembles from `binary`.
    fn assemble(binary: &str) -> Image {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new(binary).file_name().unwrap().to_str().unwrap();
        let archive = dir.path().join(format!("{file}.oci.tar"));
        run(Command::new(root().join("scripts/image"))
            .args(["--binary", binary, "--out"])
            .arg(&archive));
        Image::open(dir, &archive)
    }

    /// The Dockerfile's stage `stage`, as `scripts/dockerfile` built it for this commit.
    fn dockerfile(stage: &str) -> Image {
        require_root();
        let dir = std::env::var_os("DOCKERFILE_IMAGES")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("CARGO_TARGET_DIR")
                    .map_or_else(|| root().join("target"), PathBuf::from)
                    .join("dockerfile")
            });
        let archive = dir.join(format!("{stage}.oci.tar"));
        assert!(
            archive.is_file(),
            "{} is missing: build the Dockerfile with scripts/dockerfile (scripts/test does), or \
             set DOCKERFILE_IMAGES to the folder it wrote",
            archive.display()
        );
        Image::open(tempfile::tempdir().unwrap(), &archive)
    }

    /// Reads `archive`'s config through skopeo and unpacks it with umoci into `dir`.
    fn open(dir: tempfile::TempDir, archive: &Path) -> Image {
        let config: Json = serde_json::from_str(&run(Command::new(tool("skopeo"))
            .args(["inspect", "--config"])
            .arg(format!("oci-archive:{}", archive.display()))))
        .unwrap();
        let layout = dir.path().join("layout");
        std::fs::create_dir(&layout).unwrap();
        run(Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&layout));
        let index: Json =
            serde_json::from_str(&std::fs::read_to_string(layout.join("index.json")).unwrap())
                .unwrap();
        let manifests = index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 1, "{index}");
        let annotations = &manifests[0]["annotations"];
        let tag = annotations["org.opencontainers.image.ref.name"]
            .as_str()
            .unwrap()
            .to_string();
        let name = annotations["io.containerd.image.name"]
            .as_str()
            .map(str::to_string);
        if let Some(name) = &name {
            assert_eq!(name.rsplit_once(':').unwrap().1, tag);
        }
        run(Command::new(tool("umoci"))
            .arg("unpack")
            .arg("--image")
            .arg(format!("{}:{tag}", layout.display()))
            .arg(dir.path().join("bundle")));
        Image {
            name,
            tag,
            config,
            dir,
        }
    }

    fn rootfs(&self) -> PathBuf {
        self.dir.path().join("bundle/rootfs")
    }

    fn strings(&self, key: &str) -> Vec<String> {
        self.config["config"][key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {}", self.config))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    fn label(&self, key: &str) -> &str {
        self.config["config"]["Labels"][key]
            .as_str()
            .unwrap_or_else(|| panic!("no label {key}"))
    }

    /// `User` as (uid, gid): numeric, so Kubernetes' runAsNonRoot can check it.
    fn user(&self) -> (u64, u64) {
        let user = self.config["config"]["User"].as_str().unwrap();
        let (uid, gid) = user.split_once(':').unwrap();
        (uid.parse().unwrap(), gid.parse().unwrap())
    }

    fn exposed_ports(&self) -> BTreeSet<String> {
        let ports = self.config["config"]["ExposedPorts"].as_object().unwrap();
        ports.keys().cloned().collect()
    }

    /// The entrypoint with `args`, chrooted into the rootfs as the image's user, with only `env`.
    fn command(&self, args: &[String], env: &[(&str, &str)]) -> Command {
        let (uid, gid) = self.user();
        let mut command = Command::new(tool("chroot"));
        command
            .arg(format!("--userspec={uid}:{gid}"))
            .arg(self.rootfs())
            .args(self.strings("Entrypoint"))
            .args(args)
            .env_clear()
            .envs(env.iter().copied());
        command
    }

    /// Writes a file into the rootfs (readable by the image's user).
    fn put(&self, path: &str, content: &str) {
        let file = self.rootfs().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, content).unwrap();
    }
}

/// The labels every image carries, and the files of a `FROM scratch` image.
fn check_common(image: &Image, entrypoint: &str) {
    assert_eq!(image.strings("Entrypoint"), [entrypoint]);
    assert_eq!(image.user(), (65532, 65532));
    assert_eq!(
        image.label("org.opencontainers.image.version"),
        env!("CARGO_PKG_VERSION")
    );
    let head = run(Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(root()));
    assert!(
        image
            .label("org.opencontainers.image.revision")
            .starts_with(head.trim())
    );
    let owner_repo = LOCAL_REPOSITORY.strip_prefix("ghcr.io/").unwrap();
    assert_eq!(
        image.label("org.opencontainers.image.source"),
        format!("https://github.com/{owner_repo}")
    );
    let libc = run(Command::new("dpkg-query").args(["-W", "-f=${Version}", "libc6"]));
    let packages = image.label("io.github.prefix-picker.debian-packages");
    assert!(
        packages.split(' ').any(|p| p == format!("libc6={libc}")),
        "{packages}"
    );
    let passwd = std::fs::read_to_string(image.rootfs().join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let group = std::fs::read_to_string(image.rootfs().join("etc/group")).unwrap();
    assert!(group.contains("nonroot:x:65532:"), "{group}");
    // Nothing but what the script puts there: no shell, no package manager.
    let top: BTreeSet<String> = std::fs::read_dir(image.rootfs())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!image.rootfs().join("bin/sh").exists());
    assert!(
        top.iter()
            .all(|f| ["etc", "lib", "lib64", "usr"].contains(&f.as_str())
                || f == entrypoint.trim_start_matches('/')),
        "{top:?}"
    );
    prints_its_version(image, entrypoint.trim_start_matches('/'));
}

/// The entrypoint, run as the image's user, prints `name` and this version.
fn prints_its_version(image: &Image, name: &str) {
    let out = image.command(&["--version".into()], &[]).output().unwrap();
    assert!(out.status.success(), "--version: {}", show(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{name} {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// The Dockerfile's stage `name` against the `scripts/image` image of the same binary: the same
/// entrypoint, default command, user and ports (what the chart and the kind recipe rely on), the
/// Dockerfile's labels and this version's tag; its binary stripped, and run as the image's user.
fn check_dockerfile_image(image: &Image, scripts: &Image, name: &str) {
    assert_eq!(image.tag, env!("CARGO_PKG_VERSION"), "{name}");
    for key in ["Entrypoint", "Cmd"] {
        assert_eq!(image.strings(key), scripts.strings(key), "{name}: {key}");
    }
    assert_eq!(image.user(), scripts.user(), "{name}");
    assert_eq!(image.exposed_ports(), scripts.exposed_ports(), "{name}");
    assert_eq!(image.label("org.opencontainers.image.title"), name);
    assert_eq!(
        image.label("org.opencontainers.image.licenses"),
        "Apache-2.0"
    );
    let sections = run(Command::new(tool("readelf"))
        .arg("-S")
        .arg(image.rootfs().join(name)));
    assert!(!sections.contains(".symtab"), "{name} is not stripped");
    prints_its_version(image, name);
}

fn chart_values() -> Value {
    let text =
        std::fs::read_to_string(root().join("deploy/helm/prefix-picker/values.yaml")).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// `containerPort/protocol` of a container, lower-case like an image's ExposedPorts.
fn container_ports(container: &Value) -> BTreeSet<String> {
    container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("TCP").to_lowercase();
            format!("{}/{protocol}", p["containerPort"].as_u64().unwrap())
        })
        .collect()
}

/// The pod spec's user and group (container securityContext first, as Kubernetes applies them).
fn run_as(pod: &Value, container: &Value) -> (u64, u64) {
    let pick = |key: &str| {
        container["securityContext"][key]
            .as_u64()
            .or(pod["securityContext"][key].as_u64())
            .unwrap_or_else(|| panic!("no {key}"))
    };
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    (pick("runAsUser"), pick("runAsGroup"))
}

/// `--flag=value` replaced in a list of arguments.
fn with_arg(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let prefix = format!("{flag}=");
    assert!(args.iter().any(|a| a.starts_with(&prefix)), "{args:?}");
    args.iter()
        .map(|a| {
            if a.starts_with(&prefix) {
                format!("{prefix}{value}")
            } else {
                a.clone()
            }
        })
        .collect()
}

/// The `scripts/image` picker image, named as the chart and the kind recipe name it, runs as the
/// chart runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_picker_image_runs_as_the_chart_runs_it() {
    let image = Image::assemble(env!("CARGO_BIN_EXE_prefix-picker"));
    check_common(&image, "/prefix-picker");
    assert_eq!(
        image.name.as_deref(),
        Some(format!("{LOCAL_REPOSITORY}:{}", env!("CARGO_PKG_VERSION")).as_str())
    );
    runs_as_the_chart_runs_it(&image).await;
}

/// The Dockerfile's picker image (its release build of this commit, on the stand-in bases)
/// declares what the `scripts/image` one does and runs as the chart runs it; its build info
/// names this commit (the `PREFIX_PICKER_REVISION` build arg).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dockerfile_prefix_picker_image_runs_as_the_chart_runs_it() {
    let image = Image::dockerfile("prefix-picker");
    let scripts = Image::assemble(env!("CARGO_BIN_EXE_prefix-picker"));
    check_dockerfile_image(&image, &scripts, "prefix-picker");
    let metrics = runs_as_the_chart_runs_it(&image).await;
    let head = run(Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root()));
    let info = format!("prefix_picker_build_info{{revision=\"{}\"", head.trim());
    assert!(
        metrics.contains(&info),
        "not this commit's build (rebuild with scripts/dockerfile): {}",
        metrics
            .lines()
            .find(|l| l.starts_with("prefix_picker_build_info"))
            .unwrap_or("no prefix_picker_build_info")
    );
}

/// The image's config and the chart agree in every scenario; its entrypoint validates every
/// rendered config, and serves with the chart's arguments (ports 0), its rendered config at the
/// mount path and Kubernetes discovery against a fake API server: `/healthz`, `/readyz` once the
/// pods are listed, gRPC readiness and `/metrics` (returned, from the sidecar scenario's run).
async fn runs_as_the_chart_runs_it(image: &Image) -> String {
    let values = chart_values();
    let chart: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root().join("deploy/helm/prefix-picker/Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(values["image"]["tag"], "", "the tag defaults to appVersion");
    assert_eq!(
        values["image"]["repository"], "",
        "no default image until a release is published"
    );

    let (_dir, rendered) = render_chart();
    let mut chart_ports = BTreeSet::new();
    let mut sidecar = None;
    for (scenario, text) in &rendered {
        let docs = documents(text);
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let pod = &deployment["spec"]["template"]["spec"];
        let container = pod["containers"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "prefix-picker")
            .unwrap();
        let name = container["image"].as_str().unwrap();
        assert_eq!(
            name,
            format!("{LOCAL_REPOSITORY}:{}", image.tag),
            "{scenario}"
        );
        if let Some(own) = &image.name {
            assert_eq!(name, own, "{scenario}");
        }
        assert!(
            container.get("command").is_none(),
            "{scenario}: the image's entrypoint must run"
        );
        assert_eq!(run_as(pod, container), image.user(), "{scenario}");
        let ports = container_ports(container);
        assert!(
            ports.is_subset(&image.exposed_ports()),
            "{scenario}: {ports:?}"
        );
        chart_ports.extend(ports);
        // The config file the chart mounts, at its path in the image's rootfs.
        let mount = container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "config")
            .unwrap()["mountPath"]
            .as_str()
            .unwrap();
        let args = strings(&container["args"]);
        let config_path = format!("{mount}/routerConfiguration");
        // `serve` (picker.args: native), or GIE's flags with the image's bare entrypoint.
        let config_flag = match args[0].as_str() {
            "serve" => "--config",
            _ => "--config-file",
        };
        assert_eq!(
            args[0] == "serve",
            scenario != "standalone-gie",
            "{scenario}: {args:?}"
        );
        assert!(
            args.contains(&format!("{config_flag}={config_path}")),
            "{scenario}: {args:?}"
        );
        let map = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["data"]["routerConfiguration"].is_string())
            .unwrap();
        let config = map["data"]["routerConfiguration"].as_str().unwrap();
        image.put(&config_path, config);
        let out = image
            .command(
                &["validate".into(), "--config".into(), config_path.clone()],
                &[],
            )
            .output()
            .unwrap();
        assert!(out.status.success(), "{scenario}: validate: {}", show(&out));
        if scenario == "sidecar" {
            sidecar = Some((args, config.to_string(), config_path));
        }
    }
    assert_eq!(chart_ports, image.exposed_ports(), "ports exposed, unused");

    // `serve` as the sidecar Deployment runs it; only the listen ports change (0: any free port).
    let (args, config, config_path) = sidecar.unwrap();
    image.put(&config_path, &config);
    let fake = FakeKube::start().await;
    fake.change(|c| {
        c.put(
            Kind::Pod,
            serde_json::json!({
                "metadata": {"name": "vllm-0", "namespace": "default", "uid": "u0",
                             "labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
                "status": {"phase": "Running", "podIP": "127.0.0.1",
                           "conditions": [{"type": "Ready", "status": "True"}]},
            }),
        )
    });
    image.put("/var/run/kubeconfig", &fake_kube::kubeconfig(&fake.url()));
    let args = with_arg(&args, "--grpc-addr", "127.0.0.1:0");
    let args = with_arg(&args, "--admin-addr", "127.0.0.1:0");
    let metrics = serves_health_and_metrics(image, &args, "grpc_addr=").await;
    // The same image with GIE's args, as GIE's chart passes them (no subcommand, Go syntax, a
    // GIE flag prefix-picker does not use): health on the plaintext health port.
    let gie: Vec<String> = [
        "--config-file",
        config_path.as_str(),
        "--grpc-port=0",
        "--grpc-health-port=0",
        "--metrics-port=0",
        "--secure-serving=false",
        "-v=2",
        "--zap-encoder=console",
        "--refresh-metrics-interval=50ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    serves_health_and_metrics(image, &gie, "health_addr=").await;
    drop(fake);
    metrics
}

/// Starts the image's entrypoint with `args` (discovery against the fake API server at
/// `/var/run/kubeconfig`), and checks `/healthz`, `/readyz`, `/metrics` and gRPC readiness on
/// the address its start-up line names after `health_key`; returns the metrics.
async fn serves_health_and_metrics(image: &Image, args: &[String], health_key: &str) -> String {
    let mut child = tokio::process::Command::from(image.command(
        args,
        &[
            ("KUBECONFIG", "/var/run/kubeconfig"),
            ("POD_NAMESPACE", "default"),
        ],
    ))
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let field = |line: &str, key: &str| {
        let rest = line.split(key).nth(1)?;
        Some(rest.split_whitespace().next()?.to_string())
    };
    let mut log = String::new();
    let (grpc, admin) = loop {
        let Some(line) = lines.next_line().await.unwrap() else {
            panic!("{args:?} exited early:\n{log}");
        };
        log.push_str(&line);
        log.push('\n');
        if let (Some(g), Some(a)) = (field(&line, health_key), field(&line, "admin_addr=")) {
            break (g, a);
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let http = reqwest::Client::new();
    let status = |path: &str| {
        let request = http.get(format!("http://{admin}{path}"));
        async move { request.send().await.ok().map(|r| r.status().as_u16()) }
    };
    assert_eq!(status("/healthz").await, Some(200));
    poll("/readyz", || async {
        (status("/readyz").await == Some(200)).then_some(())
    })
    .await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let readiness = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        readiness,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("kthena_router_prefix_cache"), "{metrics}");
    child.kill().await.unwrap();
    metrics
}

/// The `scripts/image` model-sim image, named as the kind recipe names it, serves as the recipe
/// runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_sim_image_serves_as_the_kind_recipe_runs_it() {
    let image = Image::assemble(testkit::workspace_bin("model-sim").to_str().unwrap());
    check_common(&image, "/model-sim");
    assert_eq!(
        image.name.as_deref(),
        Some(model_sim_name(&image.tag).as_str())
    );
    serves_as_the_kind_recipe_runs_it(&image).await;
}

/// The Dockerfile's model-sim stage declares what the `scripts/image` one does and serves as the
/// kind recipe runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dockerfile_model_sim_image_serves_as_the_kind_recipe_runs_it() {
    let image = Image::dockerfile("model-sim");
    let scripts = Image::assemble(testkit::workspace_bin("model-sim").to_str().unwrap());
    check_dockerfile_image(&image, &scripts, "model-sim");
    serves_as_the_kind_recipe_runs_it(&image).await;
}

/// The name `scripts/image` gives the model-sim image, and the kind recipe runs.
fn model_sim_name(tag: &str) -> String {
    let owner = LOCAL_REPOSITORY.rsplit_once('/').unwrap().0;
    format!("{owner}/model-sim:{tag}")
}

/// The kind recipe's Deployment (`deploy/kind/model-sim.yaml`) and the image agree: name and
/// tag, no `command`, the image's user and port; the image serves `/health` and vLLM's
/// `/metrics` with its default arguments.
async fn serves_as_the_kind_recipe_runs_it(image: &Image) {
    let docs =
        documents(&std::fs::read_to_string(root().join("deploy/kind/model-sim.yaml")).unwrap());
    let pod = &docs[0]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"].as_str(),
        Some(model_sim_name(&image.tag).as_str())
    );
    assert!(container.get("command").is_none());
    assert_eq!(run_as(pod, container), image.user());
    assert_eq!(container_ports(container), image.exposed_ports());
    let port = image.exposed_ports().pop_first().unwrap();
    let args = strings(&container["args"]);
    assert!(
        args.contains(&format!("--port={}", port.trim_end_matches("/tcp"))),
        "{args:?}"
    );

    // The image's own arguments (listen on every address), on any free port.
    let mut args = image.strings("Cmd");
    args.push("--port=0".into());
    let mut child = tokio::process::Command::from(image.command(&args, &[]))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next_line().await.unwrap().expect("model-sim exited");
    let bound: std::net::SocketAddr = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bound.ip().is_unspecified(), "{line}");
    let base = format!("http://127.0.0.1:{}", bound.port());
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("vllm:num_requests_waiting"), "{metrics}");
    child.kill().await.unwrap();
}
