#!/usr/bin/env python3
"""Scale-out on PostgreSQL with each node capped at a share of a core (issue 52).

For each round and each node count (1, 2, 3 by default, in a rotating order), starts
`openprogram cluster --nodes N --cpu-per-node SHARE` (a throwaway PostgreSQL, not capped),
runs `openprogram load --url n1,…` against every node, and prints one JSON line: steps/s,
step p99, each node's CPU seconds and where they went (by thread name), the CPU share of
PostgreSQL and of the load's client, and how often the nodes were held back at their cap.

    sudo benches/scale_out.py target/release/openprogram [--share 0.3] [--rounds 5]
        [--nodes 1,2,3] [--executions 1000] [--steps 50] [--concurrency 1000]

Needs root (cgroup v1 cpu) and PostgreSQL's server programs (apt-get install postgresql).
"""
import argparse, collections, json, os, resource, signal, subprocess, sys, tempfile, time

TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(path):
    """The fields of a /proc stat file after the command name (field 3 onward)."""
    with open(path) as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2 :].split(), stat[stat.index("(") + 1 : stat.rindex(")")]


def process_seconds(pid, reaped=False):
    """CPU seconds of a process, its ended threads included (and its reaped children's)."""
    try:
        fields, _ = stat_fields(f"/proc/{pid}/stat")
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def thread_seconds(pid):
    """CPU seconds of a process's live threads by thread name (role): where its time went."""
    roles = collections.Counter()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return roles
    for tid in tids:
        try:
            fields, name = stat_fields(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
        role = name.rstrip("0123456789-").rstrip("-") or name
        roles[role] += (int(fields[11]) + int(fields[12])) / TICK
    return roles


def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields, _ = stat_fields(f"/proc/{entry}/stat")
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def postgres_seconds(data_dir):
    """The server's CPU seconds: the postmaster with its ended backends, and the live ones."""
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        master = int(f.readline())
    return process_seconds(master, reaped=True) + sum(process_seconds(pid) for pid in children(master))


def one_run(args, nodes):
    with tempfile.TemporaryDirectory(prefix="op-scale-") as tmp:
        os.chmod(tmp, 0o755)  # PostgreSQL runs as its own user
        cluster_dir = os.path.join(tmp, "cluster")
        out = open(os.path.join(tmp, "cluster.out"), "w+")
        err = open(os.path.join(tmp, "cluster.err"), "w")
        cluster = subprocess.Popen(
            [args.binary, "cluster", "--nodes", str(nodes), "--cpu-per-node", str(args.share),
             "--dir", cluster_dir, "--token", "scale-out-bench-token-0123456789"],
            stdout=out, stderr=err)
        try:
            deadline = time.time() + 120
            described = None
            while described is None:
                if cluster.poll() is not None or time.time() > deadline:
                    err.flush()
                    sys.exit(f"cluster did not start: {open(err.name).read()[-2000:]}")
                out.seek(0)
                line = out.readline()
                described = json.loads(line) if line.endswith("\n") else None
                time.sleep(0.1)
            pg_data = os.path.join(cluster_dir, "postgres", "data")
            pids = [node["pid"] for node in described["nodes"]]
            before = [(process_seconds(pid), thread_seconds(pid)) for pid in pids]
            pg_before, started = postgres_seconds(pg_data), time.time()
            client = resource.getrusage(resource.RUSAGE_CHILDREN)
            load = subprocess.run(
                [args.binary, "load", "--url", ",".join(n["url"] for n in described["nodes"]),
                 "--token", described["token"], "--executions", str(args.executions),
                 "--steps", str(args.steps), "--concurrency", str(args.concurrency), "--json"],
                capture_output=True, text=True)
            wall = time.time() - started
            pg_cpu = postgres_seconds(pg_data) - pg_before
            reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
            client_cpu = (reaped.ru_utime + reaped.ru_stime) - (client.ru_utime + client.ru_stime)
            after = [(process_seconds(pid), thread_seconds(pid)) for pid in pids]
            lines = load.stdout.strip().splitlines()
            if load.returncode != 0 or not lines:
                sys.exit(f"load failed ({load.returncode}): {load.stderr[-2000:]}")
            report = json.loads(lines[-1])
        finally:
            cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(timeout=120)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()
        err.close()
        log = open(err.name).read()
        held = [line.strip() for line in log.splitlines() if "held back" in line]
        node_cpu = [a[0] - b[0] for a, b in zip(after, before)]
        node_roles = [{role: round(a[1][role] - b[1].get(role, 0), 2) for role in a[1]
                       if a[1][role] - b[1].get(role, 0) >= 0.05} for a, b in zip(after, before)]
        return {
            "nodes": nodes, "cpu_per_node": args.share,
            "steps_per_s": report.get("steps_per_s"), "step_p99_ms": report.get("step_p99_ms"),
            "failed": report.get("failed"), "wall_s": round(wall, 2),
            "postgres_cpu_share": round(pg_cpu / wall, 3),
            "client_cpu_share": round(client_cpu / wall, 3),
            "node_cpu_share": [round(seconds / wall, 3) for seconds in node_cpu],
            "node_cpu_s_by_thread": node_roles, "held_back": held,
            # A node started again has a new pid, whose time before is not counted.
            "nodes_restarted": log.count("starting node"),
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--share", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", default="1,2,3")
    parser.add_argument("--executions", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=1000)
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    for round_ in range(args.rounds):
        order = counts[round_ % len(counts):] + counts[: round_ % len(counts)]
        for nodes in order:
            print(json.dumps({"round": round_ + 1, **one_run(args, nodes)}), flush=True)


if __name__ == "__main__":
    main()
