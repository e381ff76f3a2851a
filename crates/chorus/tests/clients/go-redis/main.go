// What an application does with go-redis v9 against a Chorus cluster: the lock and rate-limiter
// idioms, strings, hashes, sets, sorted sets, expiry, pipelines, transactions, pub/sub, SCAN and
// errors, over RESP3 (go-redis v9's default, negotiated with HELLO 3) and RESP2, writing on one
// node and reading on another. Run by crates/chorus/tests/cluster.rs with the nodes' addresses;
// prints "ok" when every check passed.
//
//	go-redis-check HOST:PORT HOST:PORT
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func must(ok bool, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf(format, args...))
	}
}

func check(ctx context.Context, protocol int, writeAddr, readAddr string) {
	write := redis.NewClient(&redis.Options{Addr: writeAddr, Protocol: protocol})
	read := redis.NewClient(&redis.Options{Addr: readAddr, Protocol: protocol})
	defer write.Close()
	defer read.Close()
	p := fmt.Sprintf("go%d:", protocol)
	must(write.Ping(ctx).Val() == "PONG", "ping")

	// The lock idiom: one holder at a time, for its time to live.
	ok, err := write.SetNX(ctx, p+"lock", "alice", 30*time.Second).Result()
	must(err == nil && ok, "first lock: %v %v", ok, err)
	ok, err = write.SetNX(ctx, p+"lock", "bob", 30*time.Second).Result()
	must(err == nil && !ok, "second lock: %v %v", ok, err)
	ttl := read.PTTL(ctx, p+"lock").Val()
	must(ttl > 0 && ttl <= 30*time.Second, "lock ttl %v", ttl)
	must(read.Get(ctx, p+"lock").Val() == "alice", "lock holder")

	// The rate limiter: INCR and EXPIRE NX in one round trip (a pipeline without MULTI).
	pipe := write.Pipeline()
	incrs := make([]*redis.IntCmd, 5)
	for i := range incrs {
		incrs[i] = pipe.Incr(ctx, p+"rate")
		pipe.ExpireNX(ctx, p+"rate", time.Minute)
	}
	_, err = pipe.Exec(ctx)
	must(err == nil, "pipeline: %v", err)
	for i, c := range incrs {
		must(c.Val() == int64(i+1), "incr %d gave %d", i, c.Val())
	}
	must(read.TTL(ctx, p+"rate").Val() > 0, "rate ttl")

	// Strings, floats, hashes, sets.
	must(write.MSet(ctx, p+"a", "1", p+"b", "2").Err() == nil, "mset")
	must(reflect.DeepEqual(read.MGet(ctx, p+"a", p+"b", p+"none").Val(), []any{"1", "2", nil}), "mget")
	must(write.IncrByFloat(ctx, p+"f", 0.5).Val() == 0.5, "incrbyfloat")
	must(write.HSet(ctx, p+"user", "name", "ada", "visits", "1").Val() == 2, "hset")
	must(write.HIncrBy(ctx, p+"user", "visits", 2).Val() == 3, "hincrby")
	must(reflect.DeepEqual(read.HGetAll(ctx, p+"user").Val(), map[string]string{"name": "ada", "visits": "3"}), "hgetall")
	must(write.SAdd(ctx, p+"s1", "a", "b", "c").Val() == 3, "sadd")
	write.SAdd(ctx, p+"s2", "b", "c", "d")
	inter := read.SInter(ctx, p+"s1", p+"s2").Val()
	sort.Strings(inter)
	must(reflect.DeepEqual(inter, []string{"b", "c"}), "sinter %v", inter)
	must(read.SIsMember(ctx, p+"s1", "a").Val(), "sismember")

	// Expiry.
	must(write.Expire(ctx, p+"user", 100*time.Second).Val(), "expire")
	must(read.TTL(ctx, p+"user").Val() > 0, "ttl")
	must(write.Persist(ctx, p+"user").Val(), "persist")

	// SCAN with a cursor.
	for i := 0; i < 150; i++ {
		write.Set(ctx, fmt.Sprintf("%sscan:%d", p, i), i, 0)
	}
	seen := map[string]bool{}
	iter := read.Scan(ctx, 0, p+"scan:*", 20).Iterator()
	for iter.Next(ctx) {
		seen[iter.Val()] = true
	}
	must(iter.Err() == nil && len(seen) == 150, "scan found %d: %v", len(seen), iter.Err())

	// Sorted sets: a leaderboard.
	must(write.ZAdd(ctx, p+"board", redis.Z{Score: 3, Member: "ada"}, redis.Z{Score: 1.5, Member: "bob"}).Val() == 2, "zadd")
	must(write.ZIncrBy(ctx, p+"board", 2, "bob").Val() == 3.5, "zincrby")
	board := read.ZRangeWithScores(ctx, p+"board", 0, -1).Val()
	must(reflect.DeepEqual(board, []redis.Z{{Score: 3, Member: "ada"}, {Score: 3.5, Member: "bob"}}), "zrange %v", board)
	must(read.ZRevRank(ctx, p+"board", "bob").Val() == 0, "zrevrank")

	// Transactions: MULTI/EXEC, and WATCH's optimistic update, retried once another client
	// changed the watched key.
	cmds, err := write.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, p+"tx", 10, 0)
		pipe.IncrBy(ctx, p+"tx", 5)
		return nil
	})
	must(err == nil && len(cmds) == 2 && cmds[1].(*redis.IntCmd).Val() == 15, "tx pipeline: %v %v", cmds, err)
	attempts := 0
	double := func(tx *redis.Tx) error {
		attempts++
		n, err := tx.Get(ctx, p+"tx").Int()
		if err != nil {
			return err
		}
		if attempts == 1 {
			read.Set(ctx, p+"tx", 1, 0)
			n = 1000
		}
		_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Set(ctx, p+"tx", n*2, 0)
			return nil
		})
		return err
	}
	err = write.Watch(ctx, double, p+"tx")
	must(errors.Is(err, redis.TxFailedErr), "a changed watched key fails the transaction: %v", err)
	must(write.Watch(ctx, double, p+"tx") == nil, "second try: %v", err)
	must(read.Get(ctx, p+"tx").Val() == "2", "after the transaction: %v", read.Get(ctx, p+"tx").Val())

	// Pub/sub: a subscriber on one node, the publisher on another.
	subscriber := read.Subscribe(ctx, p+"chan")
	_, err = subscriber.Receive(ctx)
	must(err == nil, "subscribe: %v", err)
	must(write.Publish(ctx, p+"chan", "hello").Err() == nil, "publish")
	select {
	case message := <-subscriber.Channel():
		must(message.Channel == p+"chan" && message.Payload == "hello", "message %v", message)
	case <-time.After(2 * time.Second):
		panic("no message within 2 s")
	}
	subscriber.Close()

	// Errors reach the application as Redis words them.
	err = read.HGet(ctx, p+"a", "field").Err()
	must(err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"), "wrongtype: %v", err)
	must(errors.Is(read.Get(ctx, p+"none").Err(), redis.Nil), "nil for a missing key")
}

func main() {
	ctx := context.Background()
	for _, protocol := range []int{3, 2} {
		check(ctx, protocol, os.Args[1], os.Args[2])
	}
	fmt.Println("ok")
}
