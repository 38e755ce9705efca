"""kazoo 2.11's side of the benchmarks: the same scenarios as
bench/recipes.rs, one per run, one JSON line out.
    python kazoo_bench.py SCENARIO CONNECT N [SESSIONS]
"""
import json
import os
import sys
import threading
import time
import uuid

from kazoo.client import KazooClient


def client(connect):
    # A 30 s session timeout, as bench/recipes.rs and CuratorBench.java ask for.
    tls = os.environ.get("ZKGATE_BENCH_TLS_DIR")
    if tls:  # the -tls scenarios
        c = KazooClient(hosts=connect, timeout=30, use_ssl=True, verify_certs=True,
                        ca=os.path.join(tls, "ca.crt"), certfile=os.path.join(tls, "client.crt"),
                        keyfile=os.path.join(tls, "client.key"))
    else:
        c = KazooClient(hosts=connect, timeout=30)
    c.start()
    return c


def pct(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    return values[round((len(values) - 1) * p)]


def report(scenario, ops, seconds, lat, hand):
    print(json.dumps({
        "impl": "kazoo", "scenario": scenario, "ops": ops, "seconds": seconds,
        "ops_per_sec": ops / seconds, "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
        "handoff_p50_ms": pct(hand, 0.5), "handoff_p99_ms": pct(hand, 0.99),
    }))


def main():
    scenario, base, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sessions = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    root = "/bench-" + uuid.uuid4().hex
    setup = client(base)
    setup.create(root)
    setup.stop()
    connect = base + root
    if scenario in ("raw", "lock"):
        c = client(connect)
        lat = []
        lock = c.Lock("/lock")
        if scenario == "lock":
            # One unmeasured cycle first, as the others do (it makes the lock's node).
            lock.acquire()
            lock.release()
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            if scenario == "raw":
                c.create("/node")
                c.delete("/node")
            else:
                lock.acquire()
                lock.release()
            lat.append((time.perf_counter() - t) * 1000)
        report(scenario, n, time.perf_counter() - start, lat, [])
        c.stop()
        return
    if scenario == "barrier":
        barrier(connect, n)
        return
    if scenario == "semaphore":
        semaphore(connect, n, sessions)
        return
    rw, many = scenario == "rw", scenario == "many"
    writers, readers = (2, 8) if rw else ((256, 0) if many else (sessions, 0))
    clients = [client(connect) for _ in range(writers + readers)]
    lat, hand, released = [], [], [0.0]
    guard = threading.Lock()

    def work(i):
        reader = i >= writers
        c = clients[i]
        path = "/lock-%d" % (i % 64) if many else "/lock"
        lock = (c.ReadLock(path) if reader else c.WriteLock(path)) if rw else c.Lock(path)
        for _ in range(n):
            t = time.perf_counter()
            lock.acquire()
            now = time.perf_counter()
            with guard:
                if not rw or not reader:
                    lat.append((now - t) * 1000)
                if not reader and not many and released[0]:
                    hand.append((now - released[0]) * 1000)
                    released[0] = 0.0
            lock.release()
            if not reader and not many:
                with guard:
                    released[0] = time.perf_counter()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(writers + readers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report(scenario, n * (writers + readers), time.perf_counter() - start, lat, hand)
    for c in clients:
        c.stop()


def semaphore(connect, n, sessions):
    """SESSIONS clients x N acquisitions of one permit of 3 (kazoo's Semaphore)."""
    clients = [client(connect) for _ in range(sessions)]
    lat, guard = [], threading.Lock()

    def work(c):
        sem = c.Semaphore("/sem", max_leases=3)
        for _ in range(n):
            t = time.perf_counter()
            sem.acquire()
            with guard:
                lat.append((time.perf_counter() - t) * 1000)
            sem.release()

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report("semaphore", n * sessions, time.perf_counter() - start, lat, [])
    for c in clients:
        c.stop()


def barrier(connect, count):
    """Line by line what bench/recipes.rs does: N participants, each its own
    session; the barrier node made first; N-1 enter and register, then the
    last one enters (the release's clock starts at its enter() call); each
    leaves once all have passed, as a gang's pods leave after their work;
    then the watch floor on the same sessions."""
    clients = [client(connect) for _ in range(count)]
    clients[0].create("/barrier")
    start = time.perf_counter()
    all_passed = threading.Barrier(count)
    released, done, failed = [0.0] * count, [0.0] * count, []

    def participant(i):
        try:
            b = clients[i].DoubleBarrier("/barrier", count)
            b.enter()
            released[i] = time.perf_counter()
            all_passed.wait()
            b.leave()
            done[i] = time.perf_counter()
        except BaseException as e:  # noqa: BLE001 (reported below)
            failed.append(e)
            all_passed.abort()

    threads = [threading.Thread(target=participant, args=(i,)) for i in range(count)]
    for t in threads[:-1]:
        t.start()
    observer = clients[count - 1]
    while len(observer.get_children("/barrier")) < count - 1:
        time.sleep(0.002)
    last_enter = time.perf_counter()
    threads[-1].start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    # The floor under any release: every session watches a node that one of
    # them then makes; from the create call until every session was notified.
    notified, lock, all_notified = [0.0] * count, threading.Lock(), threading.Event()
    pending = [count]

    def watcher(i):
        def fired(_event):
            notified[i] = time.perf_counter()
            with lock:
                pending[0] -= 1
                if pending[0] == 0:
                    all_notified.set()
        return fired

    for i, c in enumerate(clients):
        if c.exists("/floor", watch=watcher(i)) is not None:
            raise SystemExit("/floor exists")
    made = time.perf_counter()
    clients[0].create("/floor")
    if not all_notified.wait(60):
        raise SystemExit("not every session was notified of /floor")
    seconds = max(done) - start
    print(json.dumps({
        "impl": "kazoo", "scenario": "barrier-%d" % count, "ops": count, "seconds": seconds,
        "ops_per_sec": count / seconds, "release_ms": (max(released) - last_enter) * 1000,
        "round_ms": seconds * 1000, "watch_floor_ms": (max(notified) - made) * 1000,
        "p50_ms": 0.0, "p99_ms": 0.0, "handoff_p50_ms": 0.0, "handoff_p99_ms": 0.0,
    }))
    for c in clients:
        c.stop()


if __name__ == "__main__":
    main()
