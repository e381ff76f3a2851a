// What a Java application does with Jedis against a Chorus cluster: the lock idiom, a rate
// limiter, strings, hashes, sorted sets, a list queue, a pipeline, MULTI/EXEC, a script, WAIT,
// pub/sub, keyspace notifications and errors, over RESP2 and RESP3, writing on one node and
// reading on another. Run by crates/chorus/tests/cluster.rs with the nodes' ports, from source
// with the jars scripts/install-client-libs fetched; prints "ok" when every check passed.
//
//	java -cp 'target/client-libs/java/*' Check.java PORT PORT

import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisPubSub;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.RedisProtocol;
import redis.clients.jedis.Response;
import redis.clients.jedis.Transaction;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.params.SetParams;
import redis.clients.jedis.resps.Tuple;

public class Check {
    static final String HOST = "127.0.0.1";

    public static void main(String[] args) throws Exception {
        int writePort = Integer.parseInt(args[0]);
        int readPort = Integer.parseInt(args[1]);
        for (RedisProtocol protocol : new RedisProtocol[] {RedisProtocol.RESP2, RedisProtocol.RESP3}) {
            String p = "jv" + protocol.version() + ":";
            try (RedisClient write = client(writePort, protocol); RedisClient read = client(readPort, protocol)) {
                pooled(write, read, p);
            }
            try (Jedis write = new Jedis(HOST, writePort)) {
                connection(write, readPort, p);
            }
        }
        notifications(writePort, readPort);
        System.out.println("ok");
    }

    static RedisClient client(int port, RedisProtocol protocol) {
        return RedisClient.builder()
            .hostAndPort(HOST, port)
            .clientConfig(DefaultJedisClientConfig.builder().protocol(protocol).build())
            .build();
    }

    /** What an application does through Jedis's pooled client. */
    static void pooled(RedisClient write, RedisClient read, String p) {
        // The lock idiom: one holder at a time, for its time to live.
        eq("OK", write.set(p + "lock", "alice", SetParams.setParams().nx().px(30000)), "lock taken");
        eq(null, write.set(p + "lock", "bob", SetParams.setParams().nx().px(30000)), "lock held");
        long ttl = read.pttl(p + "lock");
        check(ttl > 0 && ttl <= 30000, "lock ttl " + ttl);

        // A rate limiter: INCR, and EXPIRE on the first hit of the window.
        long hits = 0;
        for (int i = 0; i < 3; i++) {
            hits = write.incr(p + "rate");
            if (hits == 1) {
                write.expire(p + "rate", 60);
            }
        }
        eq(3L, hits, "hits");
        long window = read.ttl(p + "rate");
        check(window > 0 && window <= 60, "rate window " + window);

        // Strings, hashes, sorted sets and a list queue.
        write.mset(p + "a", "1", p + "b", "2");
        eq(java.util.Arrays.asList("1", "2", null), read.mget(p + "a", p + "b", p + "none"), "mget");
        eq(2L, write.hset(p + "user", Map.of("name", "ada", "visits", "1")), "hset");
        eq(3L, write.hincrBy(p + "user", "visits", 2), "hincrby");
        eq(Map.of("name", "ada", "visits", "3"), read.hgetAll(p + "user"), "hgetall");
        eq(2L, write.zadd(p + "board", Map.of("ada", 3.0, "bob", 1.5)), "zadd");
        List<Tuple> board = read.zrangeWithScores(p + "board", 0, -1);
        eq("bob", board.get(0).getElement(), "lowest");
        eq(1.5, board.get(0).getScore(), "lowest score");
        eq(3.0, board.get(1).getScore(), "highest score");
        eq(2L, write.rpush(p + "queue", "job1", "job2"), "rpush");
        eq(List.of(p + "queue", "job1"), read.blpop(1, p + "queue"), "blpop");

        // A script.
        Object scripted = write.eval(
            "return redis.call('INCRBY', KEYS[1], ARGV[1]) + redis.call('INCRBY', KEYS[1], ARGV[1])",
            List.of(p + "scripted"), List.of("2"));
        eq(6L, scripted, "eval");
        eq("4", read.get(p + "scripted"), "scripted value");

        // Errors reach the application as Redis words them.
        try {
            read.hget(p + "a", "field");
            throw new AssertionError("HGET on a string succeeded");
        } catch (JedisDataException e) {
            check(e.getMessage().startsWith("WRONGTYPE"), "error: " + e.getMessage());
        }
    }

    /** A pipeline, a transaction, WAIT and pub/sub on single connections. */
    static void connection(Jedis write, int readPort, String p) throws Exception {
        Pipeline pipeline = write.pipelined();
        Response<Long> first = pipeline.incr(p + "n");
        Response<Long> second = pipeline.incr(p + "n");
        Response<String> got = pipeline.get(p + "n");
        pipeline.sync();
        eq(List.of(1L, 2L, "2"), List.of(first.get(), second.get(), got.get()), "pipeline");

        Transaction transaction = write.multi();
        transaction.set(p + "tx", "10");
        transaction.incrBy(p + "tx", 5);
        eq(List.of("OK", 15L), transaction.exec(), "exec");

        // Every node of the three has the writes: both nodes besides the leader.
        eq(2L, write.waitReplicas(2, 5000), "wait");

        Messages messages = new Messages();
        Thread subscriber = new Thread(() -> {
            try (Jedis listener = new Jedis(HOST, readPort)) {
                listener.subscribe(messages, p + "chan");
            }
        });
        subscriber.start();
        check(messages.subscribed.await(5, TimeUnit.SECONDS), "not subscribed within 5 s");
        write.publish(p + "chan", "hello");
        eq(p + "chan hello", messages.received.poll(5, TimeUnit.SECONDS), "message");
        messages.unsubscribe();
        subscriber.join(5000);
    }

    /** Keyspace notifications, set on one node, heard on another: the watch of a key. */
    static void notifications(int writePort, int readPort) throws Exception {
        try (Jedis write = new Jedis(HOST, writePort)) {
            eq("OK", write.configSet("notify-keyspace-events", "K$g"), "config set");
            Messages messages = new Messages();
            Thread watcher = new Thread(() -> {
                try (Jedis listener = new Jedis(HOST, readPort)) {
                    listener.psubscribe(messages, "__keyspace@0__:jv:watched");
                }
            });
            watcher.start();
            check(messages.subscribed.await(5, TimeUnit.SECONDS), "not watching within 5 s");
            write.set("jv:watched", "1");
            write.expire("jv:watched", 100);
            write.del("jv:watched");
            for (String event : List.of("set", "expire", "del")) {
                eq("__keyspace@0__:jv:watched " + event, messages.received.poll(5, TimeUnit.SECONDS), event);
            }
            messages.punsubscribe();
            watcher.join(5000);
            eq("OK", write.configSet("notify-keyspace-events", ""), "config reset");
        }
    }

    static class Messages extends JedisPubSub {
        final CountDownLatch subscribed = new CountDownLatch(1);
        final BlockingQueue<String> received = new LinkedBlockingQueue<>();

        @Override
        public void onSubscribe(String channel, int count) {
            subscribed.countDown();
        }

        @Override
        public void onPSubscribe(String pattern, int count) {
            subscribed.countDown();
        }

        @Override
        public void onMessage(String channel, String message) {
            received.add(channel + " " + message);
        }

        @Override
        public void onPMessage(String pattern, String channel, String message) {
            received.add(channel + " " + message);
        }
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    static void eq(Object want, Object got, String what) {
        if (!Objects.equals(want, got)) {
            throw new AssertionError(what + ": wanted " + want + ", got " + got);
        }
    }
}
