"""Renders the Helm chart and validates Kubernetes manifests without a cluster.

Run by tests/integration/deploy/mod.rs with the pinned tools of .venv-deploy (scripts/tools.sh):

  deploy_check.py render OUT_DIR        lint the chart (strict) and render every scenario to
                                        OUT_DIR/<scenario>.yaml (the gateway examples'
                                        values files as gateway-<name>); bad values must
                                        fail to render
  deploy_check.py render-values JSON    print the chart rendered with the values JSON (on top of
                                        LOCAL_IMAGE)
  deploy_check.py helm COMMAND...       run each documented `helm install|upgrade|template`
                                        COMMAND (one string each) offline: its release,
                                        namespace, -f files and --set values rendered against
                                        the local chart; one JSON line per command
  deploy_check.py validate FILE...      schema-validate every document of every file
  deploy_check.py manifests --check|--write
                                        deploy/manifests/*.yaml == the chart rendered with
                                        LOCAL_IMAGE (sidecar.yaml) and mode=standalone
  deploy_check.py import-crd SOURCE CRD.yaml...
                                        vendor the openAPIV3Schema of every served version of
                                        each CRD (descriptions dropped) into schemas/crds/,
                                        labelled with SOURCE (repository@tag, path)

Validation per kind (each document must match one; an unknown kind is an error):
- built-in kinds: kubernetes-validate, strict (unknown fields fail), against Kubernetes 1.30 (the
  chart's minimum) and 1.37;
- ServiceMonitor and EnvoyFilter: the Pydantic models generated from the prometheus-operator and
  Istio CRDs (cloudcoil-models-*); a field the model does not know is dropped by Pydantic, so the
  model's dump is compared with the input and any dropped key fails;
- CRDs vendored from their projects (schemas/crds/, schemas/README.md: versions, licenses):
  InferencePool (GIE), HTTPRoute and Gateway (Gateway API), DestinationRule and Telemetry
  (Istio), PrometheusRule (prometheus-operator), EnvoyProxy, EnvoyExtensionPolicy, EnvoyPatchPolicy and Backend (Envoy Gateway): the
  CRD's own schema, made strict (an object with `properties` and neither
  `additionalProperties` nor `x-kubernetes-preserve-unknown-fields` rejects unknown keys, as
  `kubectl apply --validate=strict` does); CEL rules (`x-kubernetes-validations`) are not run;
- HealthCheckPolicy and GCPBackendPolicy (GKE, whose CRDs are not published): hand-written
  structural JSON Schemas (schemas/README.md says what they cover);
- EnvoyExtensionPolicy and EnvoyPatchPolicy are also checked by the hand-written schemas of the
  legacy examples (schemas/envoy*.json), which pin the fields those examples rely on.
"""

import copy
import functools
import json
import pathlib
import re
import shlex
import sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "prefix-picker"
MANIFESTS = ROOT / "deploy" / "manifests"
SCHEMAS = pathlib.Path(__file__).resolve().parent / "schemas"
CRDS = SCHEMAS / "crds"
KUBE_VERSIONS = ["1.30.0", "1.37.0"]
RELEASE, NAMESPACE = "prefix-picker", "default"

# kubernetes-validate re-reads its multi-megabyte definitions file for every document; the
# files never change, so read each once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents)

# The chart has no default image until a release is published (`required` in _helpers.tpl):
# every render here names the one `scripts/image` builds, as docs/kind.md installs it.
LOCAL_IMAGE = {"image": {"repository": "ghcr.io/prefix-picker/prefix-picker"}}


def merged(base, over):
    """`over` deep-merged onto a copy of `base` (maps merge, anything else replaces), as Helm
    merges values files and --set."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# name -> values (on top of LOCAL_IMAGE); each renders and validates.
SCENARIOS = {
    "sidecar": {},
    "standalone": {"mode": "standalone"},
    # GIE's endpoint-picker flags instead of `serve` (and the plaintext gRPC health port 9003).
    "standalone-gie": {"mode": "standalone", "picker": {"args": "gie"}},
    "full": {
        "replicaCount": 2,
        "discovery": {"kubernetes": {
            "namespace": "models", "inferencePool": "llama-pool", "targetPorts": [8000, 8001],
            "roleLabel": "llm-d.ai/role", "modelLabel": "app.kubernetes.io/model"}},
        "envoy": {"failOpen": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "podDisruptionBudget": {"enabled": True},
        "picker": {"env": [{"name": "RUST_LOG", "value": "info"}]},
        "extraConfig": {"auth": {}},
        "configMapName": "kthena-router-config",
        "kvcacheAware": {
            "redis": {"host": "redis-server.kthena-system.svc.cluster.local",
                      "passwordSecret": {"name": "redis-secret", "key": "password"}},
            "relay": {"enabled": True, "model": "Qwen/Qwen3-0.6B"}},
    },
}

# The values files of the gateway examples: one scenario each, "gateway-<name>".
EXAMPLES = CHART / "examples"
for _path in sorted(EXAMPLES.glob("*.yaml")):
    SCENARIOS["gateway-" + _path.stem] = yaml.safe_load(_path.read_text())

# Values that must not render (the chart's `fail` checks), each on top of LOCAL_IMAGE.
BAD_VALUES = {
    "unknown mode": {"mode": "gateway"},
    "no targetPorts": {"discovery": {"kubernetes": {"targetPorts": []}}},
    "no selector": {"modelServers": {"matchLabels": None}},
    "kv-relay without a model": {"kvcacheAware": {"relay": {"enabled": True}}},
    "extraConfig overriding a chart section": {"extraConfig": {"picker": {"seed": 1}}},
    "InferencePool in sidecar mode": {"inferencePool": {"create": True}},
    "unknown gateway provider": {"mode": "standalone", "inferencePool": {"create": True},
                                 "gateway": {"provider": "nginx"}},
    "HTTPRoute without a pool": {"mode": "standalone", "httpRoute": {"create": True}},
    "unknown failureMode": {"mode": "standalone",
                            "inferencePool": {"create": True, "failureMode": "Open"}},
    "removed gateway.accessLog": {"mode": "standalone", "inferencePool": {"create": True},
                                  "gateway": {"provider": "istio", "accessLog": {"enabled": True}}},
    "PodDisruptionBudget keeping every replica": {"replicaCount": 2,
                                                  "podDisruptionBudget": {"minAvailable": 2}},
    "GIE args in sidecar mode": {"picker": {"args": "gie"}},
    "shared KV-event socket with two replicas": {"replicaCount": 2,
                                                 "picker": {"kvEventsBindPort": 5557}},
    "shared KV-event socket on the admin port": {"picker": {"kvEventsBindPort": 9090}},
    "shared KV-event socket bound twice": {"picker": {
        "kvEventsBindPort": 5557, "settings": {"kvEvents": {"bind": "tcp://*:5558"}}}},
    "shared KV-event socket port out of range": {"picker": {"kvEventsBindPort": 70000}},
}

# The chart's defaults must not render either: no image is published, and the message says
# how to get one (rendered without LOCAL_IMAGE).
NO_IMAGE_MESSAGE = "image.repository is not set: no prefix-picker release has been published"

# Helm's install order, so the rendered files read top-down.
KIND_ORDER = ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Deployment",
              "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule", "InferencePool", "Backend", "EnvoyProxy",
              "Gateway", "HTTPRoute", "DestinationRule", "Telemetry", "HealthCheckPolicy",
              "GCPBackendPolicy"]


def render(values, release=RELEASE, namespace=NAMESPACE):
    """One multi-document YAML text, documents in install order, with `# Source:` lines."""
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name=release, namespace=namespace, is_install=True)
    docs = []
    for path, text in files.items():
        if path.endswith("NOTES.txt"):
            continue
        for part in text.split("\n---\n"):
            if yaml.safe_load(part) is None:
                continue
            docs.append((path, part.strip("\n")))

    def order(item):
        kind = yaml.safe_load(item[1])["kind"]
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return (rank, item[0])

    docs.sort(key=order)
    header = ("# Rendered from deploy/helm/prefix-picker by deploy/tools/deploy_check.py "
              "(release {}, namespace {}); do not edit.\n").format(release, namespace)
    return header + "".join("---\n# Source: {}\n{}\n".format(p, d) for p, d in docs)


def lint():
    report = helm.lint(str(CHART), LOCAL_IMAGE, strict=True, namespace=NAMESPACE)
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    problems += report.get("errors", [])
    return ["helm lint: {}".format(p) for p in problems]


def dropped_keys(given, kept, path=""):
    """Keys of `given` that are missing from `kept` (fields a model ignored)."""
    out = []
    if isinstance(given, dict) and isinstance(kept, dict):
        for k, v in given.items():
            if k not in kept:
                out.append("{}.{}".format(path, k))
            else:
                out += dropped_keys(v, kept[k], "{}.{}".format(path, k))
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (g, k) in enumerate(zip(given, kept)):
            out += dropped_keys(g, k, "{}[{}]".format(path, i))
    return out


def pydantic_validator(model):
    def check(doc):
        try:
            parsed = model.model_validate(doc)
        except Exception as e:  # pydantic.ValidationError names every bad field
            return [str(e)]
        kept = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
        return ["unknown field {}".format(p) for p in dropped_keys(doc, kept)]
    return check


def json_schema_validator(name):
    schema = json.loads((SCHEMAS / name).read_text())
    validator = jsonschema.Draft202012Validator(schema)

    def check(doc):
        return ["{}: {}".format("/".join(map(str, e.absolute_path)) or "(root)", e.message)
                for e in validator.iter_errors(doc)]
    return check


def without_descriptions(node):
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def import_crds(source, path, kinds):
    """Writes schemas/crds/<kind>.<group>.json for each CRD of `path` (those of `kinds` if any)."""
    written = []
    for doc in yaml.safe_load_all(pathlib.Path(path).read_text()):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        kind = spec["names"]["kind"]
        if kinds and kind not in kinds:
            continue
        versions = {v["name"]: without_descriptions(v["schema"]["openAPIV3Schema"])
                    for v in spec["versions"] if v.get("served", True)}
        out = {"source": source, "crd": doc["metadata"]["name"], "group": spec["group"],
               "kind": kind, "versions": versions}
        CRDS.mkdir(parents=True, exist_ok=True)
        target = CRDS / "{}.{}.json".format(kind.lower(), spec["group"])
        target.write_text(json.dumps(out, sort_keys=True, separators=(",", ":")) + "\n")
        written.append(target)
    found = {p.name.split(".")[0] for p in written}
    missing = {k for k in kinds if k.lower() not in found}
    return written, ["no CRD for kind {} in {}".format(k, path) for k in sorted(missing)]


def strict_schema(node):
    """A CRD's structural schema as a JSON Schema that rejects unknown fields (the API server
    prunes them silently; `kubectl apply --validate=strict` rejects them) and honours
    `nullable`."""
    if isinstance(node, list):
        return [strict_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_schema(v) for k, v in node.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


@functools.lru_cache(maxsize=None)
def vendored_crds():
    """(apiVersion, kind) -> (validator, source) for every version of every vendored CRD."""
    out = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        for version, schema in crd["versions"].items():
            schema = strict_schema(schema)
            # Every object has these, whether or not the CRD lists them (Istio's do not).
            props = schema.setdefault("properties", {})
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            props.setdefault("metadata", {"type": "object"})
            schema.setdefault("required", [])
            schema["required"] = sorted(set(schema["required"]) | {"apiVersion", "kind"})
            validator = jsonschema.Draft202012Validator(schema)
            out[("{}/{}".format(crd["group"], version), crd["kind"])] = (validator, crd["source"])
    return out


def vendored_crd_validator(validator, source):
    def check(doc):
        return ["{}: {} (CRD from {})".format(
                    "/".join(map(str, e.absolute_path)) or "(root)", e.message, source)
                for e in validator.iter_errors(doc)]
    return check


def all_of(*checks):
    return lambda doc: [e for check in checks for e in check(doc)]


def service_monitor(doc):
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor  # slow import: lazy
    return pydantic_validator(ServiceMonitor)(doc)


def envoy_filter(doc):
    from cloudcoil.models.istio.networking.v1alpha3 import EnvoyFilter  # slow import: lazy
    return pydantic_validator(EnvoyFilter)(doc)


def crd_validators():
    out = {key: vendored_crd_validator(*v) for key, v in vendored_crds().items()}
    eg = "gateway.envoyproxy.io/v1alpha1"
    out.update({
        ("monitoring.coreos.com/v1", "ServiceMonitor"): service_monitor,
        ("networking.istio.io/v1alpha3", "EnvoyFilter"): envoy_filter,
        # The real CRD, and the legacy examples' hand-written schema on top.
        (eg, "EnvoyExtensionPolicy"): all_of(out[(eg, "EnvoyExtensionPolicy")],
                                             json_schema_validator("envoyextensionpolicy.json")),
        (eg, "EnvoyPatchPolicy"): all_of(out[(eg, "EnvoyPatchPolicy")],
                                         json_schema_validator("envoypatchpolicy.json")),
        ("networking.gke.io/v1", "HealthCheckPolicy"):
            json_schema_validator("gke-healthcheckpolicy.json"),
        ("networking.gke.io/v1", "GCPBackendPolicy"):
            json_schema_validator("gke-gcpbackendpolicy.json"),
    })
    return out


def validate_doc(doc, crds):
    if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
        return ["not a Kubernetes object (no apiVersion/kind)"]
    key = (doc["apiVersion"], doc["kind"])
    if key in crds:
        return crds[key](doc)
    errors = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            return ["no schema for {} {} (not a built-in kind, no CRD validator)".format(*key)]
        except kubernetes_validate.ValidationError as e:
            where = "/".join(map(str, e.path)) or "(root)"
            errors.append("Kubernetes {}: {}: {}".format(version, where, e.message))
    return errors


def validate_files(paths):
    crds = crd_validators()
    failures, count = [], 0
    for path in paths:
        for i, doc in enumerate(yaml.safe_load_all(pathlib.Path(path).read_text())):
            if doc is None:
                continue
            count += 1
            name = "{} #{} {} {}".format(path, i, doc.get("kind", "?") if isinstance(doc, dict)
                                         else "?", (doc.get("metadata") or {}).get("name", "")
                                         if isinstance(doc, dict) else "")
            failures += ["{}: {}".format(name, e) for e in validate_doc(doc, crds)]
    return failures, count


def manifests(write):
    # The rendered header, then where the image comes from (the one value set for them).
    note = ("# The image is {}, the name `scripts/image` builds: no registry\n"
            "# serves it until a release is published. Change the picker's `image:` line to one you\n"
            "# built and pushed, or load it into the nodes (kind: docs/kind.md); docs/deploy.md#images.\n"
            ).format(LOCAL_IMAGE["image"]["repository"])

    def with_note(text):
        first, rest = text.split("\n", 1)
        return first + "\n" + note + rest
    expected = {"sidecar.yaml": with_note(render(LOCAL_IMAGE)),
                "standalone.yaml": with_note(render(merged(LOCAL_IMAGE, {"mode": "standalone"})))}
    if write:
        MANIFESTS.mkdir(parents=True, exist_ok=True)
        for name, text in expected.items():
            (MANIFESTS / name).write_text(text)
        return []
    stale = []
    for name, text in expected.items():
        path = MANIFESTS / name
        if not path.exists() or path.read_text() != text:
            stale.append("deploy/manifests/{} is not the chart's render: run "
                         "`.venv-deploy/bin/python deploy/tools/deploy_check.py manifests "
                         "--write`".format(name))
    return stale


def set_value(values, assignment):
    """Applies one `--set` assignment (Helm's strvals for dotted keys and scalars: `a.b=c`,
    several separated by commas; true/false/null and integers typed, the rest strings)."""
    for part in re.split(r"(?<!\\),", assignment):
        key, sep, raw = part.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", key):
            raise ValueError("--set {}: only dotted keys with a scalar value are supported "
                             "here".format(part))
        raw = raw.replace("\\,", ",")
        value = {"true": True, "false": False, "null": None}.get(raw, raw)
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", raw):
            value = int(raw)
        node = values
        *path, last = key.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value


def helm_command(command):
    """Renders a documented `helm install|upgrade [--install]|template NAME CHART ...` command
    against the local chart, without a cluster. Returns the rendered text; raises ValueError for
    a command this cannot run (another chart, an unknown flag) and helm.HelmError for one Helm
    refuses."""
    words = shlex.split(command)
    if words[:1] != ["helm"] or len(words) < 2 or words[1] not in ("install", "upgrade",
                                                                   "template"):
        raise ValueError("not a helm install/upgrade/template command")
    args, positional, values, namespace = words[2:], [], {}, NAMESPACE
    i = 0
    while i < len(args):
        a = args[i]
        flag, eq, inline = a.partition("=") if a.startswith("--") else (a, "", "")

        def arg():
            nonlocal i
            if eq:
                return inline
            i += 1
            if i >= len(args):
                raise ValueError("{} needs a value".format(a))
            return args[i]
        if flag in ("-n", "--namespace"):
            namespace = arg()
        elif flag in ("-f", "--values"):
            path = ROOT / arg()
            values = merged(values, yaml.safe_load(path.read_text()) or {})
        elif flag == "--set":
            set_value(values, arg())
        elif flag in ("-i", "--install", "--create-namespace", "--wait", "--atomic"):
            pass
        elif flag.startswith("-"):
            raise ValueError("unsupported flag {}".format(a))
        else:
            positional.append(a)
        i += 1
    if len(positional) != 2:
        raise ValueError("expected NAME CHART, got {}".format(positional))
    name, chart = positional
    if (ROOT / chart).resolve() != CHART:
        raise ValueError("chart {} is not deploy/helm/prefix-picker".format(chart))
    return render(values, release=name, namespace=namespace)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]
    problems = []
    if cmd == "render" and len(args) == 1:
        out = pathlib.Path(args[0])
        out.mkdir(parents=True, exist_ok=True)
        problems += lint()
        for name, values in SCENARIOS.items():
            (out / "{}.yaml".format(name)).write_text(render(merged(LOCAL_IMAGE, values)))
            print("rendered {}".format(name))
        for what, values in BAD_VALUES.items():
            try:
                render(merged(LOCAL_IMAGE, values))
                problems.append("values with {} rendered without an error".format(what))
            except helm.HelmError as e:
                print("rejected as expected ({}): {}".format(what, str(e).splitlines()[0]))
        try:
            render({})
            problems.append("the chart's defaults rendered without an image")
        except helm.HelmError as e:
            if NO_IMAGE_MESSAGE not in str(e):
                problems.append("the defaults failed without the image message: {}".format(e))
            else:
                print("rejected as expected (defaults, no image): {}".format(
                    str(e).splitlines()[0]))
    elif cmd == "render-values" and len(args) == 1:
        sys.stdout.write(render(merged(LOCAL_IMAGE, json.loads(args[0]))))
    elif cmd == "helm" and args:
        for command in args:
            try:
                text = helm_command(command)
                images = [c["image"] for d in yaml.safe_load_all(text)
                          if d and d["kind"] == "Deployment"
                          for c in d["spec"]["template"]["spec"]["containers"]]
                print(json.dumps({"command": command, "ok": True, "images": images}))
            except (ValueError, OSError, helm.HelmError) as e:
                print(json.dumps({"command": command, "ok": False, "error": str(e)}))
    elif cmd == "validate" and args:
        problems, count = validate_files(args)
        print("validated {} documents in {} files".format(count, len(args)))
    elif cmd == "import-crd" and len(args) >= 2:
        written, problems = import_crds(args[0], args[1], args[2:])
        for path in written:
            print("wrote {}".format(path.relative_to(ROOT)))
    elif cmd == "manifests" and args in (["--check"], ["--write"]):
        problems = manifests(args == ["--write"])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print("FAIL " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
