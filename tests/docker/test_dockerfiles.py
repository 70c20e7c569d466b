"""The Dockerfiles, checked without a Docker engine: every base image pinned, the versions they install
equal versions.env and pyproject.toml, and the image matches what the MPIJob manifest expects."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = ["training.Dockerfile", "airflow.Dockerfile"]


def versions_env() -> dict[str, str]:
    out = {}
    for line in (ROOT / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    lines, out, current = (DOCKER / name).read_text().splitlines(), [], ""
    for line in lines:
        if line.lstrip().startswith("#") and not current:
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued RUN
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            keyword, _, rest = current.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def arg_defaults(name: str) -> dict[str, str]:
    out = {}
    for keyword, rest in instructions(name):
        if keyword == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            out.setdefault(key.strip(), value.strip().strip('"'))
    return out


def global_args(name: str) -> dict[str, str]:
    out = {}
    for keyword, rest in instructions(name):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            out[key.strip()] = value.strip().strip('"')
    return out


def base_images(name: str) -> list[str]:
    """Every FROM image with build args resolved to their defaults; stage names are skipped."""
    args, stages, images = global_args(name), set(), []
    for keyword, rest in instructions(name):
        if keyword != "FROM":
            continue
        parts = [p for p in rest.split() if not p.startswith("--")]
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0])
        if len(parts) >= 3 and parts[1].upper() == "AS":
            stages.add(parts[2])
        if image not in stages:
            images.append(image)
    return images


def pinned(image: str) -> bool:
    if re.search(r"@sha256:[0-9a-f]{64}$", image):
        return True
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return False
    tag = last.split(":", 1)[1]
    # An exact release (x.y.z) in the tag: "3.11-slim" or "latest" move under you.
    return tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag) is not None


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_base_image_is_pinned(name):
    images = base_images(name)
    assert images, f"{name} has no FROM"
    for image in images:
        assert pinned(image), f"{name}: base image {image!r} is not pinned to an exact version or digest"


def test_pin_check_itself():
    assert pinned("python:3.11.13-slim-bookworm") and pinned("apache/airflow:3.3.2-python3.11")
    assert pinned("python@sha256:" + "0" * 64)
    assert not pinned("python:3.11-slim") and not pinned("python") and not pinned("busybox:latest")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_version_args_equal_versions_env(name):
    versions, defaults = versions_env(), arg_defaults(name)
    shared = set(versions) & set(defaults)
    assert "PYTHON_VERSION" in shared
    for key in shared:
        assert defaults[key] == versions[key], f"{name}: ARG {key}={defaults[key]} but versions.env says {versions[key]}"


def test_training_image_versions():
    versions, defaults = versions_env(), arg_defaults("training.Dockerfile")
    assert defaults["TORCH_VERSION"] == versions["TORCH_VERSION"]
    assert defaults["HOROVOD_VERSION"] == versions["HOROVOD_VERSION"]
    # The base image's Python is the pinned minor version.
    assert re.match(rf"python:{re.escape(versions['PYTHON_VERSION'])}\.\d+-", base_images("training.Dockerfile")[0])


def test_airflow_image_versions():
    versions = versions_env()
    assert base_images("airflow.Dockerfile") == [f"apache/airflow:{versions['AIRFLOW_VERSION']}-python{versions['PYTHON_VERSION']}"]


def test_pyproject_pins_match_versions_env():
    versions = versions_env()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"torch=={versions['TORCH_VERSION']}" in project["dependencies"]
    assert f"apache-airflow=={versions['AIRFLOW_VERSION']}" in project["optional-dependencies"]["airflow"]
    assert project["requires-python"] == f">={versions['PYTHON_VERSION']}"


def test_training_image_builds_horovod_like_setup_sh():
    runs = " ".join(rest for keyword, rest in instructions("training.Dockerfile") if keyword == "RUN")
    assert "docker/build-horovod.sh" in runs and "horovodrun --check-build" in runs
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in runs
    assert '"torch==${TORCH_VERSION}"' in runs
    copies = [rest for keyword, rest in instructions("training.Dockerfile") if keyword == "COPY"]
    assert any("docker/build-horovod.sh" in c for c in copies) and any("versions.env" in c for c in copies)


def test_training_image_matches_the_mpijob_manifest():
    from ringflow.training.core.backends.kubernetes.mpijob import MPIJobSettings

    settings = MPIJobSettings(image="r/ringflow-training:0.1.0")
    defaults = arg_defaults("training.Dockerfile")
    steps = instructions("training.Dockerfile")
    assert int(defaults["SSH_PORT"]) == settings.ssh_port
    assert int(defaults["MPI_UID"]) == settings.run_as_user
    assert settings.ssh_path == "/home/mpiuser/.ssh"
    assert any(k == "COPY" and "/home/mpiuser/.sshd_config" in rest for k, rest in steps)
    assert "HostKey /home/mpiuser/.ssh/id_rsa" in (DOCKER / "sshd_config").read_text()
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users[-1] == "mpiuser", "the training image must not run as root"
    env = " ".join(rest for keyword, rest in steps if keyword == "ENV")
    for var in ("LD_LIBRARY_PATH", "PYTHONPATH"):  # forwarded with mpirun -x, so they must exist
        assert f"{var}=" in env


@pytest.mark.job
def test_airflow_image_installs_ringflow_with_cpu_torch_only():
    runs = " ".join(rest for keyword, rest in instructions("airflow.Dockerfile") if keyword == "RUN")
    assert "pip install --no-deps /opt/ringflow" in runs
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in runs
    # torch for the evaluate step, pinned and from the CPU index; never Horovod
    assert '"torch==${TORCH_VERSION}"' in runs and '--extra-index-url "${TORCH_INDEX_URL}"' in runs
    assert "horovod" not in " ".join(re.findall(r"pip install ([^&]*)", runs))
    args = dict(rest.split("=", 1) for keyword, rest in instructions("airflow.Dockerfile")
                if keyword == "ARG" and "=" in rest)
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    reqs = subprocess.run([sys.executable, str(DOCKER / "requirements_without_torch.py"), str(ROOT / "pyproject.toml")],
                          capture_output=True, text=True, check=True).stdout.split()
    names = {re.split(r"[<>=!~\[]", r)[0].lower().replace("_", "-") for r in reqs}
    assert "torch" not in names and "apache-airflow" not in names
    assert {"kubernetes", "kubernetes-asyncio"} <= names
    assert "mlflow-skinny" in names  # the train/evaluate/promote tasks log to MLflow when a pipeline asks
    # Every runtime dependency but torch (the S3 SDK, pyarrow, ...) comes along, whatever they are today.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~\[ ]", r)[0].lower().replace("_", "-") for r in project["dependencies"]}
    assert core - {"torch"} <= names


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_context_is_filtered(name):
    ignore = (DOCKER / f"{name}.dockerignore").read_text().splitlines()
    assert "*" in ignore  # everything out (.venv, caches, runs) ...
    copied = [rest.split()[:-1] for keyword, rest in instructions(name) if keyword == "COPY" and "--from" not in rest]
    for sources in copied:
        for src in (s for s in sources if not s.startswith("--")):
            # ... except what the Dockerfile copies.
            assert f"!{src}" in ignore or f"!{src}/" in ignore, f"{name} copies {src}, which the .dockerignore excludes"
            assert (ROOT / src).exists(), f"{name} copies {src}, which does not exist"


def stages(name: str) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, in order (global ARGs before the first FROM dropped)."""
    out: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions(name):
        if keyword == "FROM":
            out.append([])
        if out:
            out[-1].append((keyword, rest))
    return out


def test_training_image_can_take_torch_and_horovod_from_a_wheelhouse():
    build = stages("training.Dockerfile")[0]
    assert ("COPY", "docker/wheelhouse/ /wheelhouse/") in build
    runs = " ".join(rest for keyword, rest in build if keyword == "RUN")
    # A torch wheel there is installed without any index (air-gapped); else the CPU index as before.
    assert 'pip install --no-index --find-links /wheelhouse "torch==${TORCH_VERSION}"' in runs
    assert 'pip install --index-url "${TORCH_INDEX_URL}"' in runs
    # A Horovod wheel there lands where build-horovod.sh looks first, so it is not compiled again.
    assert runs.index('cp /wheelhouse/horovod-"${HOROVOD_VERSION}"-*.whl /wheels/') < runs.index("build-horovod.sh /wheels")
    ignored = (ROOT / "docker/wheelhouse/.gitignore").read_text().split()
    assert ignored[0] == "*" and set(ignored[1:]) == {"!README.md", "!.gitignore"}, "wheels must never be committed"


def test_the_ca_bundle_is_a_build_secret_and_never_in_the_image():
    build, final = stages("training.Dockerfile")
    for keyword, rest in build:
        if keyword == "RUN" and "pip " in rest:
            assert rest.startswith("--mount=type=secret,id=ca_bundle"), f"a RUN that reaches PyPI lacks the CA: {rest[:80]}"
    for keyword, rest in final:
        assert "ca_bundle" not in rest and "PIP_CERT" not in rest, f"the final stage uses the CA bundle: {keyword} {rest}"
    for keyword, rest in build + final:
        assert not (keyword in ("ENV", "ARG") and "PIP_CERT" in rest), "PIP_CERT must not persist in a layer"
        assert not (keyword in ("COPY", "ADD") and ".crt" in rest), "a CA file must not be copied into a layer"
    # What reaches the final stage from the build stage is the two venvs alone: torch's, and TensorFlow's.
    assert [rest for keyword, rest in final if keyword == "COPY" and "--from" in rest] == [
        "--from=build /opt/venv /opt/venv", "--from=build /opt/tensorflow /opt/tensorflow"]


@pytest.mark.job
def test_the_training_image_has_the_tensorflow_venv_the_trainjob_settings_name():
    from ringflow.training.core.backends.kubernetes.settings import TrainJobSettings

    defaults, runs = arg_defaults("training.Dockerfile"), [
        rest for keyword, rest in instructions("training.Dockerfile") if keyword == "RUN"]
    assert defaults["TENSORFLOW"] == "1" and defaults["TENSORFLOW_VERSION"] == versions_env()["TENSORFLOW_VERSION"]
    (tf_run,) = [r for r in runs if "/opt/tensorflow" in r]
    venv = TrainJobSettings(image="r/ringflow-training:0.1.0").tensorflow_python.removesuffix("/bin/python")
    assert venv == "/opt/tensorflow" and f"-m venv {venv}" in tf_run
    assert '"tensorflow-cpu==${TENSORFLOW_VERSION}"' in tf_run and "--core" in tf_run
    assert "pip install --no-deps /src" in tf_run and "import tensorflow, tf_keras, ringflow.training.core.backends" in tf_run
    assert defaults["TF_KERAS_VERSION"] == versions_env()["TF_KERAS_VERSION"] and '"tf-keras==${TF_KERAS_VERSION}"' in tf_run
    # The TF venv's requirements: ringflow's core ones, never torch, Horovod, Airflow or the Kubernetes client.
    reqs = subprocess.run([sys.executable, str(DOCKER / "requirements_without_torch.py"), "--core",
                           str(ROOT / "pyproject.toml")], capture_output=True, text=True, check=True).stdout.split()
    names = {re.split(r"[<>=!~\[]", r)[0].lower() for r in reqs}
    assert {"numpy", "pyarrow", "boto3"} <= names
    assert not names & {"torch", "horovod", "apache-airflow", "kubernetes", "mlflow-skinny"}


def test_the_build_script_passes_versions_env_and_the_secret():
    script = (ROOT / "scripts/build-training-image.sh").read_text()
    assert "source versions.env" in script
    for key in ("PYTHON_VERSION", "TORCH_VERSION", "HOROVOD_VERSION", "TENSORFLOW_VERSION", "TF_KERAS_VERSION"):
        assert f'--build-arg "{key}=${key}"' in script, key
    assert '--build-arg "BASE_IMAGE=$base_image"' in script
    assert '--secret "id=ca_bundle,src=$ca_bundle"' in script
    # chroot isolation (no container runtime needed) and the docker format (else buildah ignores SHELL).
    assert "--isolation chroot" in script and "--format docker" in script
    assert "-f docker/training.Dockerfile --ignorefile docker/training.Dockerfile.dockerignore" in script


def test_every_package_in_the_tree_is_installed_by_pip_install_src():
    # The image installs ringflow with `pip install /src` (not editable): a subpackage missing from
    # pyproject's explicit list is absent there, while an editable dev install still finds it.
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for top, package in (("training", "ringflow.training"), ("operators", "ringflow.operators")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            name = ".".join((package, *parts))
            assert name in listed, f"{name} ({init.parent.relative_to(ROOT)}) is missing from [tool.setuptools] packages"


def test_the_gpu_variant_builds_horovod_with_nccl_on_a_pinned_cuda_base():
    text = (DOCKER / "training.Dockerfile").read_text()
    # The documented GPU build (the header): a pinned CUDA devel base (Horovod compiles against CUDA and
    # NCCL headers) and CUDA torch wheels of the same CUDA version.
    base = re.search(r"--build-arg BASE_IMAGE=(nvidia/cuda:\S+)", text).group(1)
    assert pinned(base) and "devel" in base, base
    cuda = re.match(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-", base)
    index = re.search(r"--build-arg TORCH_INDEX_URL=(\S+/whl/cu(\d+))", text)
    assert index and index.group(2) == cuda.group(1) + cuda.group(2), (base, index and index.group(1))
    assert "--build-arg GPU=1" in text and arg_defaults("training.Dockerfile")["GPU"] == "0"
    runs = [rest for keyword, rest in stages("training.Dockerfile")[0] if keyword == "RUN"]
    horovod = next(r for r in runs if "build-horovod.sh" in r)
    # NCCL for GPU builds only, set before build-horovod.sh runs, and checked once Horovod is installed.
    gpu_branch = re.search(r'if \[ "\$\{GPU\}" = "1" \]; then(.*?);\s+else', horovod).group(1)
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in gpu_branch and "HOROVOD_CUDA_HOME=" in gpu_branch
    assert horovod.index("HOROVOD_GPU_OPERATIONS=NCCL") < horovod.index("build-horovod.sh /wheels")
    check = horovod.index("assert hvd.nccl_built()")
    assert horovod.index('pip install "/wheels/horovod-') < check
    assert horovod.rfind('if [ "${GPU}" = "1" ]', 0, check) > horovod.index("horovodrun --check-build")


@pytest.mark.job  # runs the script (no network: its python fails `-m pip`, so a rebuild stops before any download)
@pytest.mark.parametrize("note, gpu_ops, patched, reused", [
    (None, "", True, True),            # a CPU wheel (the wheelhouse's, or one from before notes were kept)
    (None, "NCCL", True, False),       # a GPU build never takes a CPU wheel
    ("NCCL", "NCCL", True, True),
    ("NCCL", "", True, False),         # nor a CPU build a GPU one
    (None, "", False, False),          # a wheel built before the script's patches (gloo-op-timeout) is rebuilt
])
def test_build_horovod_reuses_a_wheel_only_for_the_same_gpu_operations_and_patches(tmp_path, note, gpu_ops, patched,
                                                                                   reused):
    version = versions_env()["HOROVOD_VERSION"]
    patches = re.search(r"^patches='(.*)'$", (DOCKER / "build-horovod.sh").read_text(), re.M).group(1)
    wheel = tmp_path / f"horovod-{version}-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("horovod/__init__.py", f"__version__ = '{version}'\n"
                     + (f"RINGFLOW_PATCHES = {patches}\n" if patched else ""))
    if note is not None:
        (tmp_path / f"horovod-{version}.gpu-operations").write_text(note)
    python = tmp_path / "python"  # reads the wheel; `-m pip download` fails, where a real rebuild would begin
    python.write_text(f'#!/bin/sh\n[ "$1" = -m ] && exit 3\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "HOROVOD_GPU_OPERATIONS": gpu_ops}
    proc = subprocess.run(["bash", str(DOCKER / "build-horovod.sh"), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=60)
    if reused:
        assert proc.returncode == 0 and "already built" in proc.stdout and wheel.exists()
    else:  # the stale wheel is gone and the build started (and stopped at pip)
        assert proc.returncode != 0 and "rebuilding" in proc.stdout and not wheel.exists(), proc.stdout + proc.stderr
