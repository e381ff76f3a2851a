// What a Node.js application does with ioredis against a Chorus cluster: the lock idiom,
// strings, hashes, sorted sets, a list queue, pipelines, MULTI/EXEC, a Lua command defined with
// defineCommand (EVALSHA, loaded on demand), pub/sub and errors, writing on one node and reading
// on another. Run by crates/chorus/tests/cluster.rs with the nodes' ports; prints "ok" when
// every check passed.
//
//	node check.js PORT PORT
"use strict";
const assert = require("node:assert/strict");
const Redis = require("ioredis");

async function check(writePort, readPort) {
  const write = new Redis({ port: writePort, lazyConnect: true, maxRetriesPerRequest: 1 });
  const read = new Redis({ port: readPort, lazyConnect: true, maxRetriesPerRequest: 1 });
  await write.connect();
  await read.connect();
  const p = "io:";
  try {
    assert.equal(await write.ping(), "PONG");

    // The lock idiom: one holder at a time, for its time to live.
    assert.equal(await write.set(p + "lock", "alice", "PX", 30000, "NX"), "OK");
    assert.equal(await write.set(p + "lock", "bob", "PX", 30000, "NX"), null);
    const ttl = await read.pttl(p + "lock");
    assert.ok(ttl > 0 && ttl <= 30000, `lock ttl ${ttl}`);

    // Strings and hashes.
    await write.mset(p + "a", "1", p + "b", "2");
    assert.deepEqual(await read.mget(p + "a", p + "b", p + "none"), ["1", "2", null]);
    assert.equal(await write.hset(p + "user", "name", "ada", "visits", "1"), 2);
    assert.equal(await write.hincrby(p + "user", "visits", 2), 3);
    assert.deepEqual(await read.hgetall(p + "user"), { name: "ada", visits: "3" });

    // Sorted sets and a list queue.
    assert.equal(await write.zadd(p + "board", 3, "ada", 1.5, "bob"), 2);
    assert.deepEqual(await read.zrange(p + "board", 0, -1, "WITHSCORES"), ["bob", "1.5", "ada", "3"]);
    assert.equal(await write.rpush(p + "queue", "job1", "job2"), 2);
    assert.deepEqual(await read.blpop(p + "queue", 1), [p + "queue", "job1"]);

    // A pipeline and a transaction.
    const piped = await write.pipeline().incr(p + "n").incr(p + "n").get(p + "n").exec();
    assert.deepEqual(piped, [[null, 1], [null, 2], [null, "2"]]);
    const done = await write.multi().set(p + "tx", "10").incrby(p + "tx", 5).exec();
    assert.deepEqual(done, [[null, "OK"], [null, 15]]);

    // A command of the application's own, in Lua.
    write.defineCommand("addTwice", {
      numberOfKeys: 1,
      lua: "return redis.call('INCRBY', KEYS[1], ARGV[1]) + redis.call('INCRBY', KEYS[1], ARGV[1])",
    });
    assert.equal(await write.addTwice(p + "scripted", 2), 6);
    assert.equal(await read.get(p + "scripted"), "4");

    // Pub/sub: a subscriber on one node, the publisher on another.
    const subscriber = new Redis({ port: readPort });
    await subscriber.subscribe(p + "chan");
    const received = new Promise((resolve, reject) => {
      subscriber.on("message", (channel, message) => resolve([channel, message]));
      setTimeout(() => reject(new Error("no message within 2 s")), 2000);
    });
    await write.publish(p + "chan", "hello");
    assert.deepEqual(await received, [p + "chan", "hello"]);
    subscriber.disconnect();

    // Errors reach the application as Redis words them.
    await assert.rejects(read.hget(p + "a", "field"), /^ReplyError: WRONGTYPE/);
  } finally {
    write.disconnect();
    read.disconnect();
  }
}

check(Number(process.argv[2]), Number(process.argv[3])).then(
  () => console.log("ok"),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
