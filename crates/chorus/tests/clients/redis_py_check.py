"""What an application does with redis-py, against a Chorus cluster: the lock and rate-limiter
idioms, strings, hashes, sets, sorted sets, a list queue, expiry, pipelines, transactions, Lua
scripts and redis-py's Lock, pub/sub, SCAN and errors, over RESP2 and RESP3, writing on one node
and reading on another. Run by crates/chorus/tests/cluster.rs with the nodes' ports; prints "ok"
and exits 0 when every check passed.

    python redis_py_check.py PORT PORT PORT
"""

import sys

import redis


def check(protocol, ports):
    write = redis.Redis(port=ports[0], protocol=protocol, decode_responses=True)
    read = redis.Redis(port=ports[1], protocol=protocol, decode_responses=True)
    p = f"py{protocol}:"
    assert write.ping()

    # The lock idiom: one holder at a time, for its time to live.
    assert write.set(p + "lock", "alice", nx=True, px=30000)
    assert write.set(p + "lock", "bob", nx=True, px=30000) is None
    assert 0 < read.pttl(p + "lock") <= 30000
    assert read.get(p + "lock") == "alice"
    assert write.getdel(p + "lock") == "alice"
    assert write.set(p + "lock", "bob", nx=True, ex=30)

    # The rate limiter: INCR and EXPIRE NX in one round trip (a pipeline without MULTI).
    pipe = write.pipeline(transaction=False)
    for _ in range(5):
        pipe.incr(p + "rate")
        pipe.expire(p + "rate", 60, nx=True)
    replies = pipe.execute()
    assert replies == [1, True, 2, False, 3, False, 4, False, 5, False], replies
    assert 0 < read.ttl(p + "rate") <= 60

    # Strings and floats.
    assert write.mset({p + "a": "1", p + "b": "2"})
    assert read.mget([p + "a", p + "b", p + "none"]) == ["1", "2", None]
    assert write.incrbyfloat(p + "f", 0.1) == 0.1
    assert write.incrbyfloat(p + "f", 0.2) == 0.3
    assert write.setrange(p + "a", 1, "xy") == 3 and read.getrange(p + "a", 0, -1) == "1xy"

    # Hashes.
    assert write.hset(p + "user", mapping={"name": "ada", "visits": "1"}) == 2
    assert write.hincrby(p + "user", "visits", 2) == 3
    assert read.hgetall(p + "user") == {"name": "ada", "visits": "3"}
    assert read.hkeys(p + "user") == ["name", "visits"]

    # Sets.
    assert write.sadd(p + "s1", "a", "b", "c") == 3
    assert write.sadd(p + "s2", "b", "c", "d") == 3
    assert read.smembers(p + "s1") == {"a", "b", "c"}
    assert read.sinter(p + "s1", p + "s2") == {"b", "c"}
    assert write.sinterstore(p + "s3", [p + "s1", p + "s2"]) == 2

    # A queue: producers push on one node, a consumer pops on another, in order.
    assert write.rpush(p + "queue", "job1", "job2", "job3") == 3
    assert read.lpop(p + "queue") == "job1"
    assert read.lrange(p + "queue", 0, -1) == ["job2", "job3"]
    assert write.lmove(p + "queue", p + "done", "LEFT", "RIGHT") == "job2"
    assert read.llen(p + "queue") == 1 and read.lindex(p + "done", 0) == "job2"
    assert tuple(read.blpop([p + "queue"], timeout=1)) == (p + "queue", "job3")
    assert read.blpop([p + "queue"], timeout=0.1) is None

    # Expiry.
    assert write.expire(p + "user", 100)
    assert 0 < read.ttl(p + "user") <= 100
    assert write.persist(p + "user") and read.ttl(p + "user") == -1

    # SCAN, as scan_iter drives it.
    for i in range(150):
        write.set(f"{p}scan:{i}", i)
    found = set(read.scan_iter(match=p + "scan:*", count=20))
    assert found == {f"{p}scan:{i}" for i in range(150)}, len(found)

    # Sorted sets: a leaderboard.
    assert write.zadd(p + "board", {"ada": 3, "bob": 1.5, "cy": 2}) == 3
    assert write.zincrby(p + "board", 2, "bob") == 3.5
    pairs = read.zrange(p + "board", 0, -1, withscores=True)
    assert [tuple(pair) for pair in pairs] == [("cy", 2.0), ("ada", 3.0), ("bob", 3.5)], pairs
    assert read.zrevrank(p + "board", "bob") == 0 and read.zscore(p + "board", "cy") == 2.0
    assert read.zrangebyscore(p + "board", "(2", "+inf") == ["ada", "bob"]
    # redis-py gives ZPOPMIN's one pair as a tuple in a list over RESP2, flat over RESP3.
    assert write.zpopmin(p + "board") in ([("cy", 2.0)], ["cy", 2.0])

    # Transactions: a MULTI/EXEC pipeline, and WATCH's optimistic update as redis-py drives it
    # (`transaction` retries when a watched key changed).
    pipe = write.pipeline()
    pipe.set(p + "tx", 10).incrby(p + "tx", 5).get(p + "tx")
    assert pipe.execute() == [True, 15, "15"]

    def double(pipe):
        value = int(pipe.get(p + "tx"))
        pipe.multi()
        pipe.set(p + "tx", value * 2)

    assert write.transaction(double, p + "tx") == [True]
    assert read.get(p + "tx") == "30"
    with write.pipeline() as pipe:
        pipe.watch(p + "tx")
        read.set(p + "tx", 1)
        pipe.multi()
        pipe.incr(p + "tx")
        try:
            pipe.execute()
            raise AssertionError("EXEC ran though a watched key changed")
        except redis.WatchError:
            pass
    assert read.get(p + "tx") == "1"

    # redis-py's Lock: its release and extend are Lua scripts (EVALSHA, loaded on demand).
    lock = write.lock(p + "rlock", timeout=30)
    assert lock.acquire(blocking=False)
    assert not read.lock(p + "rlock", timeout=30).acquire(blocking=False)
    assert lock.extend(10) and lock.owned()
    lock.release()
    other = read.lock(p + "rlock", timeout=30)
    assert other.acquire(blocking=False)
    other.release()

    # A script registered by the application, run on one node, read on another.
    add = write.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1]) * 2")
    assert add(keys=[p + "scripted"], args=[4]) == 8
    assert read.get(p + "scripted") == "4"

    # Pub/sub: a subscriber on one node, the publisher on another.
    subscriber = read.pubsub()
    subscriber.subscribe(p + "chan")
    confirmed = subscriber.get_message(timeout=2)
    assert confirmed and confirmed["type"] == "subscribe", confirmed
    write.publish(p + "chan", "hello")
    message = subscriber.get_message(timeout=2)
    assert message and message["type"] == "message" and message["data"] == "hello", message
    subscriber.close()

    # Errors are raised as Redis raises them.
    try:
        read.hget(p + "a", "field")
        raise AssertionError("HGET on a string did not fail")
    except redis.ResponseError as e:
        assert str(e).startswith("WRONGTYPE"), e

    assert write.client_setname("checker") and write.client_getname() == "checker"
    assert write.rename(p + "a", p + "renamed") and read.get(p + "renamed") == "1xy"
    assert write.delete(p + "renamed", p + "b") == 2


def main():
    ports = [int(p) for p in sys.argv[1:]]
    for protocol in (2, 3):
        check(protocol, ports)
    print("ok")


if __name__ == "__main__":
    main()
