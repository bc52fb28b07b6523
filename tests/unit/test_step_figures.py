"""The moving figure each setup step's output gives: Go packages compiled, Debian packages, wheels downloaded."""

from __future__ import annotations

from ddpjob_box.step_figures import GoFigure, ImageFigure, NoFigure


def read_all(figure: GoFigure | ImageFigure, lines: list[str]) -> str:
    for line in lines:
        figure.read(line + "\n")
    return figure.text()


def test_go_builds_count_the_modules_downloaded_and_the_packages_compiled_of_the_current_build() -> None:
    text = read_all(
        GoFigure(),
        [
            "building etcd, kube-apiserver (k8s-v1.37.2-etcd-v3.7.0) into /c/bin/k8s-v1.37.2-etcd-v3.7.0",
            "go: downloading k8s.io/kubernetes v1.37.2",
            "go: downloading go.etcd.io/etcd/server/v3 v3.7.0",
            "internal/goarch",
            "k8s.io/apimachinery/pkg/util/proxy",
            "k8s.io/kubernetes/cmd/kube-apiserver",
        ],
    )
    assert text == "building k8s, 2 modules downloaded, 3 Go packages compiled"


def test_go_builds_say_nothing_until_a_build_starts_and_ignore_error_lines() -> None:
    figure = GoFigure()
    figure.read("k8s-v1.37.2-etcd-v3.7.0: etcd kubectl in /c/bin/k8s\n")  # a cached build's summary
    assert figure.text() == ""
    text = read_all(figure, ["building helm (helm-v3.19.5) into /c/bin/helm-v3.19.5", "# some/pkg", "x.go:1: oops"])
    assert text == "building helm, 0 Go packages compiled"


def test_the_base_image_counts_debian_packages_retrieved_unpacked_and_configured() -> None:
    text = read_all(
        ImageFigure(),
        [
            "building localhost/ddpjob/base:0123 from debootstrap bookworm (http://deb.debian.org/debian)",
            "I: Retrieving InRelease",
            "I: Retrieving Packages",
            "I: Retrieving adduser 3.134",
            "I: Retrieving apt 2.6.1",
            "I: Unpacking required packages...",
            "I: Unpacking adduser...",
            "I: Configuring required packages...",
        ],
    )
    assert text == "building base, Debian packages: 2 retrieved, 1 unpacked, 0 configured"


def test_an_image_from_the_dockerfile_shows_its_step_and_the_wheels_downloaded_and_under_way() -> None:
    figure = ImageFigure()
    lines = [
        "building ghcr.io/ddpjob/trainer:0.1.0 (localhost/ddpjob/trainer:abcd) with buildah",
        "STEP 5/14: RUN --mount=type=cache,target=/root/.cache/pip python -m venv /opt/ddpjob",
        "Collecting torch==2.14.1",
        "  Downloading torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl (812.3 MB)",
        "Collecting nvidia-nccl-cu12",
        "  Downloading https://files.example/nvidia_nccl_cu12-2.27.3-py3-none-manylinux.whl (1.2 GB)",
    ]
    assert read_all(figure, lines) == (
        "building trainer STEP 5/14, 812 MB of wheels downloaded, now nvidia_nccl_cu12 (1.2 GB)"
    )
    figure.read("Saved ./nvidia_nccl_cu12-2.27.3-py3-none-manylinux.whl\n")
    assert figure.text() == "building trainer STEP 5/14, 2.0 GB of wheels downloaded"


def test_a_multi_stage_build_shows_its_stage_beside_its_step() -> None:
    lines = [
        "building ghcr.io/ddpjob/operator:0.1.0 (localhost/ddpjob/operator:abcd) with buildah",
        "[3/7] STEP 2/3: COPY --from=requirements /requirements/operator.txt /tmp/requirements.txt",
    ]
    assert read_all(ImageFigure(), lines) == "building operator STEP 2/3 of stage 3/7"


def test_exporting_an_image_resets_the_step_and_the_debian_counts() -> None:
    lines = [
        "building localhost/ddpjob/base:0123 from debootstrap bookworm (mirror)",
        "I: Retrieving adduser 3.134",
        "exporting ghcr.io/ddpjob/trainer:0.1.0 into /c/images/oci",
    ]
    assert read_all(ImageFigure(), lines) == "exporting trainer"


def test_a_step_without_a_figure_shows_only_its_time() -> None:
    figure = NoFigure()
    figure.read("Collecting torch\n")
    assert figure.text() == ""


def test_an_import_into_a_node_store_names_the_image_and_the_store() -> None:
    lines = [
        "exporting ghcr.io/ddpjob/trainer:0.1.0 into /c/images/oci",
        "importing ghcr.io/ddpjob/trainer:0.1.0-0a1b2c into node store 1",
    ]
    assert read_all(ImageFigure(), lines) == "importing trainer into node store 1"


def test_one_go_build_of_several_keys_names_each() -> None:
    line = "building etcd, helm (k8s-v1.37.2-etcd-v3.7.2+helm-v3.19.5+prometheus-v0.316.0) into /c/bin"
    assert read_all(GoFigure(), [line, "internal/goarch"]) == "building k8s+helm+prometheus, 1 Go packages compiled"
