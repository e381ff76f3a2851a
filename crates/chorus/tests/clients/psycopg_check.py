"""psycopg 3 against a Chorus SQL cluster: writes through the leader, reads on a replica.

Usage: psycopg_check.py LEADER_PORT REPLICA_PORT. Prints "ok" or fails with the reason.
"""

import sys
import time

import psycopg
from psycopg import errors


def connect(port, **kwargs):
    return psycopg.connect(host="127.0.0.1", port=port, user="chorus", dbname="chorus", connect_timeout=5, **kwargs)


def read_until(conn, query, expected, within_s=10):
    deadline = time.time() + within_s
    while True:
        rows = conn.execute(query).fetchall()
        if rows == expected or time.time() > deadline:
            return rows
        time.sleep(0.1)


def main():
    leader_port, replica_port = int(sys.argv[1]), int(sys.argv[2])
    with connect(leader_port) as leader, connect(replica_port, autocommit=True) as replica:
        leader.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL, tag BLOB)")
        leader.commit()
        # Parameters (server-side binding), executemany, and a transaction block.
        with leader.transaction():
            leader.execute("INSERT INTO items VALUES (%s, %s, %s, %s)", (1, "apple", 0.5, b"\x00\x01"))
            with leader.cursor() as cur:
                cur.executemany(
                    "INSERT INTO items (id, name, price) VALUES (%s, %s, %s)",
                    [(2, "pear", 0.75), (3, "plum", None)],
                )
        # A rolled-back transaction leaves nothing.
        try:
            with leader.transaction():
                leader.execute("INSERT INTO items (id, name) VALUES (%s, %s)", (4, "fig"))
                leader.execute("INSERT INTO items (id, name) VALUES (%s, %s)", (1, "dup"))
            raise AssertionError("a duplicate key committed")
        except errors.UniqueViolation:
            pass
        leader.commit()
        rows = read_until(replica, "SELECT id, name, price FROM items ORDER BY id", [(1, "apple", 0.5), (2, "pear", 0.75), (3, "plum", None)])
        assert rows == [(1, "apple", 0.5), (2, "pear", 0.75), (3, "plum", None)], rows
        # Replicas refuse writes as a standby would.
        try:
            replica.execute("INSERT INTO items (id, name) VALUES (9, 'no')")
            raise AssertionError("a replica took a write")
        except errors.ReadOnlySqlTransaction:
            pass
        count = replica.execute("SELECT count(*) FROM items WHERE id = %s", ("1",)).fetchone()
        assert count == (1,), count
        # COPY FROM STDIN inside a transaction, row by row (psycopg writes the text format).
        with leader.cursor() as cur:
            with cur.copy("COPY items (id, name, price) FROM STDIN") as copy:
                copy.write_row((10, "kiwi", 1.25))
                copy.write_row((11, "lime\ttab", None))
        leader.commit()
        copied = [(10, "kiwi", 1.25), (11, "lime\ttab", None)]
        rows = read_until(replica, "SELECT id, name, price FROM items WHERE id >= 10 ORDER BY id", copied)
        assert rows == copied, rows
    print("ok")


if __name__ == "__main__":
    main()
