"""Run `diffcheck compare` from Python and get its JSON report back.

    report = diffcheck.compare("dumps/tp", reference="dumps/ref.h5")   # passes: the report
    # a divergence raises diffcheck.Divergence (an AssertionError: a pytest failure)
    # with .report, .first_divergence and .output (the console report)

Exit status 1 (a check failed) -> Divergence; 2 (the files could not be read
or break the format) -> InputError; anything else -> DiffcheckError.
"""
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile

from diffcheck.loss_scale_hint import loss_scale_hint


class DiffcheckError(RuntimeError):
    """diffcheck could not give a verdict (not found, crashed, killed)."""

    def __init__(self, message, returncode=None, output="", stderr=""):
        super().__init__(message)
        self.returncode, self.output, self.stderr = returncode, output, stderr


class InputError(DiffcheckError):
    """Exit 2: a file could not be read or does not follow docs/FORMAT.md; the
    message is diffcheck's, naming the file, tap and attribute."""


class Divergence(DiffcheckError, AssertionError):
    """Exit 1: a check failed. `.report` is the whole JSON report,
    `.first_divergence` its first failing tap ({"tap", "order", "checks",
    "summary"})."""

    def __init__(self, report, output, stderr):
        fd = report.get("first_divergence") or {}
        super().__init__(f"diffcheck: first divergence at tap '{fd.get('tap')}': {fd.get('summary', '')}".strip(),
                         1, output, stderr)
        self.report, self.first_divergence = report, fd


# `diffcheck sweep-mesh -- COMMAND` sets it: the last report of the program's
# compare() is copied there, so the sweep reads its verdict and taps.
REPORT_JSON_VARIABLE = "DIFFCHECK_REPORT_JSON"


def _beside_interpreter():
    """The executable `pip install .` put in this environment's scripts folder
    (found also when the venv is not activated: its bin/ is then not on PATH)."""
    path = os.path.join(sysconfig.get_path("scripts"), "diffcheck")
    return path if os.access(path, os.X_OK) else None


def find_executable(exe=None):
    """`exe`, else $DIFFCHECK_EXE, else `diffcheck` on PATH, else the one
    beside this interpreter (a venv's bin/, where `pip install .` puts it)."""
    exe = exe or os.environ.get("DIFFCHECK_EXE") or shutil.which("diffcheck") or _beside_interpreter()
    if not exe:
        raise DiffcheckError("the diffcheck executable was not found: `pip install .` from the checkout (into "
                             "this environment), or `bash scripts/setup.sh` (into /usr/local/bin), or set "
                             "DIFFCHECK_EXE")
    return exe


# What a launcher (mpirun, srun, PMIx) gives the processes of a job. `diffcheck
# compare` called from one of them must not inherit it: it would start as a
# member of the caller's MPI job, which does not expect it, and be killed.
# Settings such as OMPI_ALLOW_RUN_AS_ROOT and the user's OMPI_MCA_* stay.
_JOB_VARIABLES = ("OMPI_COMM_WORLD_", "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir",
                  "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_APP_CTX_NUM_PROCS", "OMPI_COMMAND", "OMPI_FILE_LOCATION",
                  "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_UNIVERSE_SIZE", "OMPI_ARGV", "PMIX_", "PMI_",
                  "SLURM_STEP_", "SLURM_PROCID", "SLURM_LOCALID")


def child_environment(env=None):
    """The environment for an MPI program started from inside an MPI job, as its own job."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if not k.startswith(_JOB_VARIABLES)}


def compare(prefix, reference=None, *, against=None, exact=False, tolerances=None, noise_floor=None, atol=None,
            rtol=None, html=None, junit=None, require_reference=False, args=(), check=True, exe=None, timeout=None):
    """Runs `diffcheck compare PREFIX [--reference REF] ...` and returns its
    JSON report as a dict (`report["pass"]`, `report["first_divergence"]`,
    `report["taps"]`). With check=True (default) a failed check raises
    Divergence carrying the report; with check=False the report is returned
    either way. `args` are passed on as they are (e.g. ["--threads", "2"]).

    Without a reference: `against=OTHER` (a prefix or run file, or a list of
    one) compares the run with another run of the same model, on any mesh;
    each tolerance is the sum of both runs' bounds. `exact=True` wants every
    bit equal (an earlier run on the same mesh and build).

    A tap the reference has no tap for is UNCHECKED (`report["unchecked_taps"]`),
    never a pass; `require_reference=True` makes it a failure."""
    cmd = [find_executable(exe), "compare", os.fspath(prefix)]
    if against is not None:
        for other in ([against] if isinstance(against, (str, os.PathLike)) else against):
            cmd += ["--against", os.fspath(other)]
    if exact:
        cmd.append("--exact")
    if require_reference:
        cmd.append("--require-reference")
    for flag, value in (("--reference", reference), ("--tolerances", tolerances), ("--noise-floor", noise_floor),
                        ("--atol", atol), ("--rtol", rtol), ("--html", html), ("--junit", junit)):
        if value is not None:
            cmd += [flag, os.fspath(value) if not isinstance(value, (int, float)) else repr(value)]
    with tempfile.TemporaryDirectory(prefix="diffcheck-compare-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        cmd += ["--json", report_path, *map(str, args)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_environment())
        except subprocess.TimeoutExpired as e:
            raise DiffcheckError(f"diffcheck compare {prefix}: no verdict within {timeout} s") from e
        report = None
        if os.path.exists(report_path):
            with open(report_path) as f:
                report = json.load(f)
            if os.environ.get(REPORT_JSON_VARIABLE):  # a sweep-mesh running this program reads it there
                shutil.copyfile(report_path, os.environ[REPORT_JSON_VARIABLE])
    if p.returncode == 2:
        raise InputError(p.stderr.strip() or p.stdout.strip(), 2, p.stdout, p.stderr)
    if p.returncode not in (0, 1) or report is None:
        raise DiffcheckError(f"diffcheck compare {prefix} ended with status {p.returncode} and no report: "
                             f"{p.stderr.strip()}", p.returncode, p.stdout, p.stderr)
    report["console"] = p.stdout
    hint = loss_scale_hint(report)
    if hint is not None:  # every failing tap an output gradient off by one factor (loss_scale_hint.py)
        report["hints"] = [hint]
        report["console"] += hint + "\n"
    if p.returncode == 1 and check:
        raise Divergence(report, report["console"], p.stderr)
    return report


def verdict(prefix, reference=None, **kwargs):
    """compare(..., check=False), its console report printed, and the exit
    status a checking program ends with: 0 when every check passes, 1 when
    one fails (an input error still raises InputError). The keywords are
    compare()'s."""
    if "check" in kwargs:
        raise TypeError("verdict() compares with check=False and returns the exit status: call compare() to raise")
    report = compare(prefix, reference, check=False, **kwargs)
    print(report["console"], end="", flush=True)
    return 0 if report["pass"] else 1
