// A Curator 5.9 participant driven line by line on stdin, for interop tests.
// Commands: mutex PATH | read PATH | write PATH | release | barrier PATH X | leave | quit
//           semaphore PATH MAX QTY (InterProcessSemaphoreV2 with a fixed maximum)
//           shared PATH COUNTPATH QTY (its maximum from a SharedCount) | return (its leases)
// Answers:  ACQUIRED | RELEASED | ENTERED | LEFT | ERROR <message>
import java.io.BufferedReader;
import java.io.InputStreamReader;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import java.util.Collection;
import org.apache.curator.framework.recipes.barriers.DistributedDoubleBarrier;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.shared.SharedCount;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryNTimes(10, 100));
        client.start();
        client.blockUntilConnected();
        System.out.println("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        InterProcessLock held = null;
        DistributedDoubleBarrier barrier = null;
        Collection<Lease> leases = null;
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split(" ");
            try {
                switch (cmd[0]) {
                    case "mutex": held = new InterProcessMutex(client, cmd[1]); held.acquire(); System.out.println("ACQUIRED"); break;
                    case "read": held = new InterProcessReadWriteLock(client, cmd[1]).readLock(); held.acquire(); System.out.println("ACQUIRED"); break;
                    case "write": held = new InterProcessReadWriteLock(client, cmd[1]).writeLock(); held.acquire(); System.out.println("ACQUIRED"); break;
                    case "release": held.release(); held = null; System.out.println("RELEASED"); break;
                    case "barrier": barrier = new DistributedDoubleBarrier(client, cmd[1], Integer.parseInt(cmd[2])); barrier.enter(); System.out.println("ENTERED"); break;
                    case "leave": barrier.leave(); System.out.println("LEFT"); break;
                    case "semaphore":
                        leases = new InterProcessSemaphoreV2(client, cmd[1], Integer.parseInt(cmd[2])).acquire(Integer.parseInt(cmd[3]));
                        System.out.println("ACQUIRED"); break;
                    case "shared": {
                        SharedCount count = new SharedCount(client, cmd[2], 1);
                        count.start();
                        leases = new InterProcessSemaphoreV2(client, cmd[1], count).acquire(Integer.parseInt(cmd[3]));
                        System.out.println("ACQUIRED"); break;
                    }
                    case "return":
                        for (Lease lease : leases) lease.close();
                        leases = null; System.out.println("RELEASED"); break;
                    case "quit": client.close(); return;
                    default: System.out.println("ERROR unknown command " + cmd[0]);
                }
            } catch (Exception e) {
                System.out.println("ERROR " + e);
            }
            System.out.flush();
        }
        client.close();
    }
}
