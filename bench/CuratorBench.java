// Curator 5.9's side of the benchmarks: the same scenarios as bench/recipes.rs,
// one per run, one JSON line out.
//   java -cp <curator jars> CuratorBench SCENARIO CONNECT N [SESSIONS]
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.barriers.DistributedDoubleBarrier;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.Watcher;

public class CuratorBench {
    // A 30 s session timeout, as bench/recipes.rs and kazoo_bench.py ask for.
    static CuratorFramework client(String connect) throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.newClient(connect, 30000, 10000, new RetryNTimes(3, 100));
        c.start();
        connected(c, connect);
        return c;
    }

    // Fails the run instead of waiting for ever (a TLS handshake that never
    // succeeds is retried without end).
    static void connected(CuratorFramework c, String connect) throws Exception {
        if (!c.blockUntilConnected(60, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to ZooKeeper at " + connect + " within 60 s");
        }
    }

    static double pct(List<Double> sorted, double p) {
        if (sorted.isEmpty()) return 0.0;
        return sorted.get((int) Math.round((sorted.size() - 1) * p));
    }

    static void report(String scenario, long ops, double seconds, List<Double> lat, List<Double> hand) {
        Collections.sort(lat);
        Collections.sort(hand);
        System.out.printf("{\"impl\":\"curator\",\"scenario\":\"%s\",\"ops\":%d,\"seconds\":%f,\"ops_per_sec\":%f,\"p50_ms\":%f,\"p99_ms\":%f,\"handoff_p50_ms\":%f,\"handoff_p99_ms\":%f}%n",
            scenario, ops, seconds, ops / seconds, pct(lat, 0.5), pct(lat, 0.99), pct(hand, 0.5), pct(hand, 0.99));
    }

    public static void main(String[] args) throws Exception {
        String scenario = args[0];
        String connect = args[1] + "/bench-" + UUID.randomUUID().toString().replace("-", "");
        int n = Integer.parseInt(args[2]);
        int sessions = args.length > 3 ? Integer.parseInt(args[3]) : 8;
        CuratorFramework root = CuratorFrameworkFactory.newClient(args[1], new RetryNTimes(3, 100));
        root.start();
        connected(root, args[1]);
        root.create().forPath(connect.substring(args[1].length()));
        root.close();
        switch (scenario) {
            case "raw": {
                CuratorFramework c = client(connect);
                List<Double> lat = new ArrayList<>();
                long start = System.nanoTime();
                for (int i = 0; i < n; i++) {
                    long t = System.nanoTime();
                    c.create().forPath("/node");
                    c.delete().forPath("/node");
                    lat.add((System.nanoTime() - t) / 1e6);
                }
                report(scenario, n, (System.nanoTime() - start) / 1e9, lat, new ArrayList<>());
                c.close();
                break;
            }
            case "lock": {
                CuratorFramework c = client(connect);
                InterProcessMutex lock = new InterProcessMutex(c, "/lock");
                lock.acquire(); lock.release();
                List<Double> lat = new ArrayList<>();
                long start = System.nanoTime();
                for (int i = 0; i < n; i++) {
                    long t = System.nanoTime();
                    lock.acquire();
                    lock.release();
                    lat.add((System.nanoTime() - t) / 1e6);
                }
                report(scenario, n, (System.nanoTime() - start) / 1e9, lat, new ArrayList<>());
                c.close();
                break;
            }
            case "contended":
            case "rw":
            case "many": {
                boolean rw = scenario.equals("rw"), many = scenario.equals("many");
                int writers = rw ? 2 : many ? 256 : sessions, readers = rw ? 8 : 0;
                List<CuratorFramework> clients = new ArrayList<>();
                for (int i = 0; i < writers + readers; i++) clients.add(client(connect));
                AtomicLong released = new AtomicLong(0);
                List<Double> lat = Collections.synchronizedList(new ArrayList<>());
                List<Double> hand = Collections.synchronizedList(new ArrayList<>());
                List<Thread> threads = new ArrayList<>();
                long start = System.nanoTime();
                for (int i = 0; i < writers + readers; i++) {
                    final boolean reader = i >= writers;
                    final CuratorFramework c = clients.get(i);
                    final String path = many ? "/lock-" + (i % 64) : "/lock";
                    Thread th = new Thread(() -> {
                        try {
                            InterProcessLock lock = rw
                                ? (reader ? new InterProcessReadWriteLock(c, path).readLock() : new InterProcessReadWriteLock(c, path).writeLock())
                                : new InterProcessMutex(c, path);
                            for (int k = 0; k < n; k++) {
                                long t = System.nanoTime();
                                lock.acquire();
                                long now = System.nanoTime();
                                if (!rw || !reader) lat.add((now - t) / 1e6);
                                if (!reader && !many) {
                                    long r = released.getAndSet(0);
                                    if (r != 0) hand.add((now - r) / 1e6);
                                }
                                lock.release();
                                if (!reader && !many) released.set(System.nanoTime());
                            }
                        } catch (Exception e) {
                            throw new RuntimeException(e);
                        }
                    });
                    th.start();
                    threads.add(th);
                }
                for (Thread th : threads) th.join();
                report(scenario, (long) n * (writers + readers), (System.nanoTime() - start) / 1e9, new ArrayList<>(lat), new ArrayList<>(hand));
                for (CuratorFramework c : clients) c.close();
                break;
            }
            case "semaphore": {
                List<CuratorFramework> clients = new ArrayList<>();
                for (int i = 0; i < sessions; i++) clients.add(client(connect));
                List<Double> lat = Collections.synchronizedList(new ArrayList<>());
                List<Thread> threads = new ArrayList<>();
                long start = System.nanoTime();
                for (int i = 0; i < sessions; i++) {
                    final CuratorFramework c = clients.get(i);
                    Thread th = new Thread(() -> {
                        try {
                            InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(c, "/sem", 3);
                            for (int k = 0; k < n; k++) {
                                long t = System.nanoTime();
                                Lease lease = sem.acquire();
                                lat.add((System.nanoTime() - t) / 1e6);
                                sem.returnLease(lease);
                            }
                        } catch (Exception e) {
                            throw new RuntimeException(e);
                        }
                    });
                    th.start();
                    threads.add(th);
                }
                for (Thread th : threads) th.join();
                report(scenario, (long) n * sessions, (System.nanoTime() - start) / 1e9, new ArrayList<>(lat), new ArrayList<>());
                for (CuratorFramework c : clients) c.close();
                break;
            }
            case "barrier": {
                // Line by line what bench/recipes.rs does: N participants, each
                // its own session; the barrier node made first; N-1 enter and
                // register, then the last one enters (the clock of the release
                // starts at its enter() call); each leaves once all have passed
                // (a latch), as a gang's pods leave after their work; then the
                // watch floor on the same sessions.
                int count = n;
                List<CuratorFramework> clients = new ArrayList<>();
                for (int i = 0; i < count; i++) clients.add(client(connect));
                clients.get(0).create().forPath("/barrier");
                long start = System.nanoTime();
                CountDownLatch allPassed = new CountDownLatch(count);
                long[] released = new long[count];
                long[] done = new long[count];
                Throwable[] failed = new Throwable[1];
                List<Thread> threads = new ArrayList<>();
                for (int i = 0; i < count; i++) {
                    final int k = i;
                    threads.add(new Thread(() -> {
                        try {
                            DistributedDoubleBarrier b = new DistributedDoubleBarrier(clients.get(k), "/barrier", count);
                            b.enter();
                            released[k] = System.nanoTime();
                            allPassed.countDown();
                            allPassed.await();
                            b.leave();
                            done[k] = System.nanoTime();
                        } catch (Throwable e) {
                            failed[0] = e;
                            while (allPassed.getCount() > 0) allPassed.countDown();
                        }
                    }));
                }
                for (int i = 0; i < count - 1; i++) threads.get(i).start();
                CuratorFramework observer = clients.get(count - 1);
                while (observer.getChildren().forPath("/barrier").size() < count - 1) Thread.sleep(2);
                long lastEnter = System.nanoTime();
                threads.get(count - 1).start();
                for (Thread th : threads) th.join();
                if (failed[0] != null) throw new RuntimeException(failed[0]);
                long rel = lastEnter, end = lastEnter;
                for (int i = 0; i < count; i++) { rel = Math.max(rel, released[i]); end = Math.max(end, done[i]); }
                // The floor under any release: every session watches a node
                // that one of them then makes; from the create call until
                // every session was notified.
                long[] notified = new long[count];
                CountDownLatch allNotified = new CountDownLatch(count);
                for (int i = 0; i < count; i++) {
                    final int k = i;
                    org.apache.zookeeper.data.Stat st = clients.get(i).checkExists().usingWatcher((Watcher) e -> {
                        notified[k] = System.nanoTime();
                        allNotified.countDown();
                    }).forPath("/floor");
                    if (st != null) throw new IllegalStateException("/floor exists");
                }
                long made = System.nanoTime();
                clients.get(0).create().forPath("/floor");
                allNotified.await();
                long floor = made;
                for (long t : notified) floor = Math.max(floor, t);
                double seconds = (end - start) / 1e9;
                System.out.printf("{\"impl\":\"curator\",\"scenario\":\"barrier-%d\",\"ops\":%d,\"seconds\":%f,\"ops_per_sec\":%f,\"release_ms\":%f,\"round_ms\":%f,\"watch_floor_ms\":%f,\"p50_ms\":0,\"p99_ms\":0,\"handoff_p50_ms\":0,\"handoff_p99_ms\":0}%n",
                    count, count, seconds, count / seconds, (rel - lastEnter) / 1e6, (end - start) / 1e6, (floor - made) / 1e6);
                for (CuratorFramework c : clients) c.close();
                break;
            }
            default:
                System.err.println("unknown scenario " + scenario);
                System.exit(2);
        }
    }
}
