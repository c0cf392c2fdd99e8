"""How the JAX examples get their devices and mesh (not diffcheck's business):
one process sees N CPU devices through XLA_FLAGS, which must be set before
jax is imported; the user's own XLA_FLAGS (the ones `diffcheck bisect --env
XLA_FLAGS` tries) are kept beside it."""
import os
import re


def use_cpu_devices(n):
    """Asks XLA's CPU backend for n devices (call before importing jax)."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def mesh_of(text, axes):
    """A jax mesh from 'dp=2,tp=4' over the given axis names (missing ones size 1)."""
    import jax
    sizes = dict.fromkeys(axes, 1)
    for part in filter(None, text.split(",")):
        name, _, size = part.partition("=")
        if name not in sizes:
            raise SystemExit(f"--mesh: '{name}' is not one of the axes {','.join(axes)}")
        sizes[name] = int(size)
    n = 1
    for s in sizes.values():
        n *= s
    if n > len(jax.devices()):
        raise SystemExit(f"--mesh {text}: {n} devices, but this process has {len(jax.devices())}")
    return jax.make_mesh(tuple(sizes.values()), tuple(sizes), devices=jax.devices()[:n])


def mesh_devices(argv, default):
    """The device count a --mesh argument in argv asks for (default when none)."""
    for i, a in enumerate(argv):
        text = a.split("=", 1)[1] if a.startswith("--mesh=") else argv[i + 1] if a == "--mesh" and i + 1 < len(argv) \
            else None
        if text:
            n = 1
            for part in filter(None, text.split(",")):
                n *= int(part.partition("=")[2] or 1)
            return n
    return default


def apply_settings(argv):
    """Takes the settings a flag bisect passes as words ({flags}) out of argv:
    `--xla_...` ones join XLA_FLAGS, `NAME=VALUE` ones set the environment
    (an opt-in such as ULYSSES_ATTENTION_CHUNKS=2). Returns the rest of argv.
    Call before jax starts its backend."""
    rest, xla = [], []
    for a in argv:
        if a.startswith("--xla_"):
            xla.append(a)
        elif re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", a):
            name, _, value = a.partition("=")
            os.environ[name] = value
        else:
            rest.append(a)
    if xla:
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *xla]).strip()
    return rest
