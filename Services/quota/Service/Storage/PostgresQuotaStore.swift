import Foundation
import Logging
import Messages
import PostgresNIO
import QuotaCore
import Storage

/// The quota service's store on PostgreSQL (`QUOTA_DATABASE_URL`), for any number of quota
/// replicas over one database. The same operations as `QuotaDatabase`, in the same rules
/// (`QuotaRules`, `QuotaLedger`'s plans, windows and checks); what differs is how concurrent
/// replicas stay exact:
/// - a user's reservations, plan changes and subscription events run one at a time, whichever
///   replica receives them: each takes a transaction-scoped advisory lock on the user
///   (`pg_advisory_xact_lock`), so admission reads the windows no other transaction is changing;
///   a guest network's shared credits and new-guest count are locked the same way;
/// - a job id is charged once: the charge's primary key; a second reservation of it by the same
///   user (serialised by the lock) answers the first admission again;
/// - a decision is durable before its answer: the transaction commits (`synchronous_commit` on)
///   before the reply is sent.
///
/// Reservations, commits and releases (the calls of every job) are decided in batches: those that
/// arrive while a batch is in PostgreSQL make the next one, decided and committed in one call,
/// one round trip whatever its size (`PostgresQuotaStore+Batches.swift`). Each batch takes
/// its users' and networks' locks in one fixed order, so replicas never deadlock.
public struct PostgresQuotaStore: QuotaStore {
    let database: PostgresPool
    let ledger: QuotaLedger
    let logger: Logger
    let batcher: PostgresBatcher<Operation, Outcome>
    let zones: ZoneCache

    public init(database: PostgresPool, plans: PlanCatalog = .standard, guests: GuestLimits = GuestLimits(), logger: Logger) {
        let ledger = QuotaLedger(plans: plans, guests: guests)
        self.database = database
        self.ledger = ledger
        self.logger = logger
        let zones = ZoneCache()
        self.zones = zones
        self.batcher = PostgresBatcher(database: database) { batch in
            try await Self.decide(batch, database: database, ledger: ledger, zones: zones, logger: logger)
        }
    }

    /// Creates or updates the quota tables (once, however many replicas start together).
    public func migrate() async throws {
        try await database.migrate(service: "quota", Self.migrations)
    }

    public static let migrations = [
        PostgresMigration("v1: users, usage, charges, subscription events, guests", [
            """
            CREATE TABLE quota_user (
                id text PRIMARY KEY, plan text NOT NULL, time_zone text, updated_at timestamptz NOT NULL,
                plan_ends_at timestamptz, subscription_event_at timestamptz)
            """,
            """
            CREATE TABLE quota_usage (
                user_id text NOT NULL, window_kind text NOT NULL, window_key text NOT NULL, used integer NOT NULL,
                PRIMARY KEY (user_id, window_kind, window_key))
            """,
            """
            CREATE TABLE quota_charge (
                job_id text PRIMARY KEY, user_id text NOT NULL, cost integer NOT NULL, state text NOT NULL,
                day_key text NOT NULL, month_key text NOT NULL, reserved_at timestamptz NOT NULL, settled_at timestamptz,
                network text)
            """,
            "CREATE INDEX quota_charge_by_user ON quota_charge (user_id, reserved_at)",
            "CREATE INDEX quota_charge_by_state ON quota_charge (state, reserved_at)",
            """
            CREATE TABLE quota_subscription_event (
                id text PRIMARY KEY, user_id text NOT NULL, type text NOT NULL, occurred_at timestamptz NOT NULL,
                result text NOT NULL, received_at timestamptz NOT NULL)
            """,
            """
            CREATE TABLE quota_guest (
                user_id text PRIMARY KEY, network text NOT NULL, first_seen double precision NOT NULL, attested_key text)
            """,
            "CREATE INDEX quota_guest_by_network ON quota_guest (network, first_seen)",
            "CREATE UNIQUE INDEX quota_guest_by_attested_key ON quota_guest (attested_key) WHERE attested_key IS NOT NULL",
        ]),
        // A batch's locks and reads in one round trip (`PostgresQuotaStore+Batches.swift`). The
        // reads are statements of a function, each with a snapshot taken after the locks (one
        // statement doing both would read from before them). Rows of four kinds in one result:
        // `c` a charge (job, user, cost, state, day, month, reserved, settled, network), `u` a user
        // (id, plan in `c`, zone in `d`, plan end in `t1`), `w` a window's usage (owner, kind,
        // used in `n`, key in `c`), `g` an attested guest (id). Charges and windows are read one
        // primary-key probe each (a lateral `LIMIT 1`), charges in the order of `job_ids` (sorted:
        // the order their locks are taken in). A function's plans are generic, and the generic
        // plan of `job_id = ANY(...) ORDER BY job_id` walked the whole primary key: 4 ms a call.
        PostgresMigration("v2: a batch's locks and reads in one call", [
            """
            CREATE FUNCTION quota_batch_read(
                lock_keys text[], job_ids text[], user_ids text[],
                usage_owners text[], usage_kinds text[], usage_keys text[], guest_ids text[])
            RETURNS TABLE (part text, a text, b text, n bigint, c text, d text, e text, t1 timestamptz, t2 timestamptz, f text)
            LANGUAGE plpgsql VOLATILE AS $fn$
            #variable_conflict use_column
            BEGIN
                PERFORM pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(lock_keys) AS k ORDER BY h) AS ordered;
                RETURN QUERY SELECT 'c'::text, q.job_id, q.user_id, q.cost::bigint, q.state, q.day_key, q.month_key, q.reserved_at, q.settled_at, q.network
                    FROM unnest(job_ids) AS j(id)
                    CROSS JOIN LATERAL (SELECT * FROM quota_charge r WHERE r.job_id = j.id LIMIT 1 FOR UPDATE) AS q;
                RETURN QUERY SELECT 'u'::text, u.id, NULL::text, NULL::bigint, u.plan, u.time_zone, NULL::text, u.plan_ends_at, NULL::timestamptz, NULL::text
                    FROM quota_user u WHERE u.id = ANY(user_ids);
                RETURN QUERY SELECT 'w'::text, k.o, k.w, u.used::bigint, k.y, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text
                    FROM unnest(usage_owners, usage_kinds, usage_keys) AS k(o, w, y)
                    CROSS JOIN LATERAL (SELECT q.used FROM quota_usage q WHERE q.user_id = k.o AND q.window_kind = k.w AND q.window_key = k.y LIMIT 1) AS u;
                RETURN QUERY SELECT 'g'::text, g.user_id, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text
                    FROM quota_guest g WHERE g.user_id = ANY(guest_ids) AND g.attested_key IS NOT NULL;
            END
            $fn$
            """,
        ]),
        // The batch's deadline set by the call itself (`transactionSettingItsTimeout`), not by a
        // `SET LOCAL` of its own: one round trip fewer. `lock_timeout` bounds the call's own lock
        // waits (read when a wait begins), `statement_timeout` the statements after it.
        PostgresMigration("v3: the batch's read call sets its deadline", [
            "DROP FUNCTION quota_batch_read(text[], text[], text[], text[], text[], text[], text[])",
            """
            CREATE FUNCTION quota_batch_read(
                timeout_ms bigint, lock_keys text[], job_ids text[], user_ids text[],
                usage_owners text[], usage_kinds text[], usage_keys text[], guest_ids text[])
            RETURNS TABLE (part text, a text, b text, n bigint, c text, d text, e text, t1 timestamptz, t2 timestamptz, f text)
            LANGUAGE plpgsql VOLATILE AS $fn$
            #variable_conflict use_column
            BEGIN
                IF timeout_ms IS NOT NULL THEN
                    PERFORM set_config('lock_timeout', timeout_ms || 'ms', true), set_config('statement_timeout', timeout_ms || 'ms', true);
                END IF;
                PERFORM pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(lock_keys) AS k ORDER BY h) AS ordered;
                RETURN QUERY SELECT 'c'::text, q.job_id, q.user_id, q.cost::bigint, q.state, q.day_key, q.month_key, q.reserved_at, q.settled_at, q.network
                    FROM unnest(job_ids) AS j(id)
                    CROSS JOIN LATERAL (SELECT * FROM quota_charge r WHERE r.job_id = j.id LIMIT 1 FOR UPDATE) AS q;
                RETURN QUERY SELECT 'u'::text, u.id, NULL::text, NULL::bigint, u.plan, u.time_zone, NULL::text, u.plan_ends_at, NULL::timestamptz, NULL::text
                    FROM quota_user u WHERE u.id = ANY(user_ids);
                RETURN QUERY SELECT 'w'::text, k.o, k.w, u.used::bigint, k.y, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text
                    FROM unnest(usage_owners, usage_kinds, usage_keys) AS k(o, w, y)
                    CROSS JOIN LATERAL (SELECT q.used FROM quota_usage q WHERE q.user_id = k.o AND q.window_kind = k.w AND q.window_key = k.y LIMIT 1) AS u;
                RETURN QUERY SELECT 'g'::text, g.user_id, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text
                    FROM quota_guest g WHERE g.user_id = ANY(guest_ids) AND g.attested_key IS NOT NULL;
            END
            $fn$
            """,
        ]),
        // Settled charges are forgotten once the idempotency window is past (`forget`): found by
        // when they settled, with no entry for the reserved ones (they are never forgotten).
        PostgresMigration("v4: settled charges by when they settled", [
            "CREATE INDEX quota_charge_settled ON quota_charge (settled_at) WHERE state <> 'reserved'",
        ]),
        // The batch read probes the windows a user's zone could need only for users with a zone
        // (`usage_always` marks the keys read whatever the zones: each owner's day and month in
        // UTC, what a user without a zone uses, and a guest network's): most users have none, and
        // the probes were most of the call (0.37 of 0.58 ms for 27 users, 5 probes each). Its
        // statements are planned once per connection: their parameters are arrays, and
        // PostgreSQL's choice between a plan for each call's values and one kept found the kept
        // one no cheaper, and planned three of them afresh at every call (0.13 ms of a 7-user
        // call's 0.31, `pg_stat_statements.track_planning`). Each probes an index per element
        // (lateral `LIMIT 1` or `= ANY`), whatever the arrays hold.
        PostgresMigration("v5: the batch read probes zones' windows only for users with a zone, with plans kept", [
            "DROP FUNCTION quota_batch_read(bigint, text[], text[], text[], text[], text[], text[], text[])",
            """
            CREATE FUNCTION quota_batch_read(
                timeout_ms bigint, lock_keys text[], job_ids text[], user_ids text[],
                usage_owners text[], usage_kinds text[], usage_keys text[], usage_always boolean[], guest_ids text[])
            RETURNS TABLE (part text, a text, b text, n bigint, c text, d text, e text, t1 timestamptz, t2 timestamptz, f text)
            LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $fn$
            #variable_conflict use_column
            DECLARE
                zoned text[];
            BEGIN
                IF timeout_ms IS NOT NULL THEN
                    PERFORM set_config('lock_timeout', timeout_ms || 'ms', true), set_config('statement_timeout', timeout_ms || 'ms', true);
                END IF;
                PERFORM pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(lock_keys) AS k ORDER BY h) AS ordered;
                RETURN QUERY SELECT 'c'::text, q.job_id, q.user_id, q.cost::bigint, q.state, q.day_key, q.month_key, q.reserved_at, q.settled_at, q.network
                    FROM unnest(job_ids) AS j(id)
                    CROSS JOIN LATERAL (SELECT * FROM quota_charge r WHERE r.job_id = j.id LIMIT 1 FOR UPDATE) AS q;
                zoned := ARRAY(SELECT u.id FROM quota_user u WHERE u.id = ANY(user_ids) AND u.time_zone <> '');
                RETURN QUERY SELECT 'u'::text, u.id, NULL::text, NULL::bigint, u.plan, u.time_zone, NULL::text, u.plan_ends_at, NULL::timestamptz, NULL::text
                    FROM quota_user u WHERE u.id = ANY(user_ids);
                RETURN QUERY SELECT 'w'::text, k.o, k.w, u.used::bigint, k.y, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text
                    FROM unnest(usage_owners, usage_kinds, usage_keys, usage_always) AS k(o, w, y, always)
                    CROSS JOIN LATERAL (SELECT q.used FROM quota_usage q WHERE q.user_id = k.o AND q.window_kind = k.w AND q.window_key = k.y LIMIT 1) AS u
                    WHERE k.always OR k.o = ANY(zoned);
                RETURN QUERY SELECT 'g'::text, g.user_id, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text
                    FROM quota_guest g WHERE g.user_id = ANY(guest_ids) AND g.attested_key IS NOT NULL;
            END
            $fn$
            """,
        ]),
        // A batch's read and write are planned once per connection, from the statistics of the
        // moment, and a new database's say "small": planned while each table held a row, their
        // probes scanned the tables whole once they held thousands (33 sequential scans in a read
        // of ten users, 10 in a write of ten releases: `PostgresQuotaBatchTests`), until an
        // ANALYZE replanned them. Planned without sequential scans, each stays a probe of a
        // primary key, as jobs' `jobs_write_changes` (its v11). The write (`BatchWrite`, a
        // prepared statement until now) becomes a function for that, its statement unchanged.
        PostgresMigration("v6: a batch's read and write planned without sequential scans", [
            "ALTER FUNCTION quota_batch_read(bigint, text[], text[], text[], text[], text[], text[], boolean[], text[]) SET enable_seqscan = off",
            """
            CREATE FUNCTION quota_batch_write(
                charge_jobs text[], charge_users text[], charge_costs bigint[], charge_states text[], charge_days text[], charge_months text[],
                charge_reserved timestamptz[], charge_settled bool[], charge_settled_at timestamptz[], charge_networks text[],
                usage_owners text[], usage_kinds text[], usage_keys text[], usage_changes bigint[])
            RETURNS bigint
            LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
            #variable_conflict use_column
            DECLARE
                written bigint;
            BEGIN
                WITH charged AS (
                    INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at, settled_at, network)
                    SELECT x.j, x.u, x.c, x.s, x.d, x.m, x.r, CASE WHEN x.settled THEN x.t END, NULLIF(x.n, '')
                    FROM unnest(charge_jobs, charge_users, charge_costs, charge_states, charge_days, charge_months, charge_reserved, charge_settled,
                                charge_settled_at, charge_networks) AS x(j, u, c, s, d, m, r, settled, t, n)
                    ORDER BY x.j
                    ON CONFLICT (job_id) DO UPDATE SET cost = excluded.cost, state = excluded.state, day_key = excluded.day_key,
                        month_key = excluded.month_key, reserved_at = excluded.reserved_at, settled_at = excluded.settled_at, network = excluded.network
                        WHERE quota_charge.user_id = excluded.user_id
                    RETURNING 1
                ), windows AS (
                    INSERT INTO quota_usage (user_id, window_kind, window_key, used)
                    SELECT w.o, w.k, w.y, w.a FROM unnest(usage_owners, usage_kinds, usage_keys, usage_changes) AS w(o, k, y, a)
                    WHERE w.a > 0 OR (SELECT true FROM quota_usage q WHERE q.user_id = w.o AND q.window_kind = w.k AND q.window_key = w.y LIMIT 1)
                    ORDER BY w.o, w.k, w.y
                    ON CONFLICT (user_id, window_kind, window_key) DO UPDATE SET used = quota_usage.used + excluded.used
                )
                SELECT count(*) INTO written FROM charged;
                RETURN written;
            END
            $fn$
            """,
        ]),
        // A batch decided in one call (`PostgresQuotaStore+Batches.swift`): the locks, the reads,
        // the decisions in order (as `QuotaRules` makes them), the writes, and a row per
        // operation. `kinds` holds `r` (reserve), `c` (commit) or `x` (release) for each
        // operation; a reservation's `zones` is the zone its `days` and `months` keys were made
        // in, checked against its user's row first: if any differs, the call answers those users'
        // zones (`zone` rows: user, zone) and decides nothing. A limit of -1 is none. Its
        // statements probe by key whatever the statistics (as v6's). New charges are inserted (a
        // job id charged by another user's batch between the read and the write fails it,
        // `unique_violation`, and the batch is run again), those that existed updated: an
        // `INSERT ... ON CONFLICT` of both was a quarter dearer (pg_stat_statements).
        // `quota_batch_read` and `quota_batch_write` stay for replicas of the version before,
        // while an upgrade rolls; a later migration may drop them.
        PostgresMigration("v7: a batch decided in one call", [
            """
            CREATE FUNCTION quota_batch_decide(
                timeout_ms bigint, lock_keys text[], kinds text[], jobs text[], users text[], costs bigint[], nows timestamptz[],
                zones text[], days text[], months text[], networks text[],
                plan_names text[], plan_daily bigint[], plan_monthly bigint[], default_plan text, network_daily bigint)
            RETURNS TABLE (r_op integer, r_code text, r_a text, r_cost bigint, r_state text, r_day text, r_month text,
                           r_reserved timestamptz, r_settled timestamptz, r_daily bigint, r_monthly bigint, r_network bigint,
                           r_plan text, r_plan_ends timestamptz)
            LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
            DECLARE
                u_ids text[]; u_plans text[]; u_zones text[]; u_ends timestamptz[];
                c_jobs text[]; c_users text[]; c_costs bigint[]; c_states text[]; c_days text[]; c_months text[];
                c_reserved timestamptz[]; c_settled timestamptz[]; c_networks text[]; c_dirty boolean[]; c_new boolean[]; fresh integer := 0;
                w_keys text[]; w_owners text[]; w_kinds text[]; w_wkeys text[]; w_used bigint[]; w_delta bigint[];
                attested text[];
                i integer; ci integer; ui integer; pi integer; di integer; mi integer; ni integer;
                sep constant text := chr(31);
                pname text; wkey text; pend timestamptz; dused bigint; mused bigint; net text; cost bigint; now_ timestamptz;
                dirty integer := 0;
            BEGIN
                IF timeout_ms IS NOT NULL THEN
                    PERFORM set_config('lock_timeout', timeout_ms || 'ms', true), set_config('statement_timeout', timeout_ms || 'ms', true);
                END IF;
                PERFORM pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(lock_keys) AS k ORDER BY h) AS ordered;

                -- The reserving users' rows; their zones must be those the keys were made in.
                SELECT array_agg(u.id), array_agg(u.plan), array_agg(coalesce(u.time_zone, '')), array_agg(u.plan_ends_at)
                    INTO u_ids, u_plans, u_zones, u_ends
                    FROM quota_user u WHERE u.id = ANY(users);
                RETURN QUERY SELECT 0, 'zone'::text, r.u, NULL::bigint, coalesce(u_zones[array_position(u_ids, r.u)], ''),
                        NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::timestamptz
                    FROM (SELECT DISTINCT x.u, x.z FROM unnest(kinds, users, zones) AS x(k, u, z) WHERE x.k = 'r') AS r
                    WHERE coalesce(u_zones[array_position(u_ids, r.u)], '') <> r.z;
                IF FOUND THEN RETURN; END IF;

                -- The charges of the batch's job ids, locked in job id order.
                SELECT array_agg(q.job_id), array_agg(q.user_id), array_agg(q.cost::bigint), array_agg(q.state), array_agg(q.day_key),
                       array_agg(q.month_key), array_agg(q.reserved_at), array_agg(q.settled_at), array_agg(coalesce(q.network, '')), array_agg(false), array_agg(false)
                    INTO c_jobs, c_users, c_costs, c_states, c_days, c_months, c_reserved, c_settled, c_networks, c_dirty, c_new
                    FROM (SELECT DISTINCT j FROM unnest(jobs) AS j ORDER BY j) AS ordered
                    CROSS JOIN LATERAL (SELECT * FROM quota_charge r WHERE r.job_id = ordered.j LIMIT 1 FOR UPDATE) AS q;

                -- The windows the reservations read: each one's day and month, and its network's day.
                SELECT array_agg(k.o || sep || k.w || sep || k.y), array_agg(k.o), array_agg(k.w), array_agg(k.y),
                       array_agg(coalesce(v.used, 0)::bigint), array_agg(0::bigint)
                    INTO w_keys, w_owners, w_kinds, w_wkeys, w_used, w_delta
                    FROM (SELECT DISTINCT s.o, s.w, s.y FROM unnest(kinds, users, days, months, networks) AS x(k, u, d, m, n)
                          CROSS JOIN LATERAL (VALUES (x.u, 'daily', x.d), (x.u, 'monthly', x.m), (CASE WHEN x.n <> '' THEN 'net:' || x.n END, 'daily', x.d)) AS s(o, w, y)
                          WHERE x.k = 'r' AND s.o IS NOT NULL) AS k
                    LEFT JOIN LATERAL (SELECT q.used FROM quota_usage q WHERE q.user_id = k.o AND q.window_kind = k.w AND q.window_key = k.y LIMIT 1) AS v ON true;

                attested := ARRAY(SELECT g.user_id FROM quota_guest g
                    WHERE g.user_id = ANY(ARRAY(SELECT x.u FROM unnest(kinds, users, networks) AS x(k, u, n) WHERE x.k = 'r' AND x.n <> ''))
                      AND g.attested_key IS NOT NULL);

                FOR i IN 1 .. coalesce(array_length(kinds, 1), 0) LOOP
                    -- (each kind sets the columns its answer is made from; the others keep what they held)
                    r_op := i;
                    ci := array_position(c_jobs, jobs[i]);
                    IF kinds[i] = 'r' THEN
                        cost := costs[i]; now_ := nows[i];
                        ui := array_position(u_ids, users[i]);
                        r_plan := u_plans[ui]; r_plan_ends := u_ends[ui]; r_network := NULL;
                        pname := r_plan; pend := r_plan_ends;
                        IF pend IS NOT NULL AND now_ >= pend THEN pname := NULL; END IF;
                        pi := coalesce(array_position(plan_names, pname), array_position(plan_names, default_plan));
                        di := array_position(w_keys, users[i] || sep || 'daily' || sep || days[i]);
                        mi := array_position(w_keys, users[i] || sep || 'monthly' || sep || months[i]);
                        dused := w_used[di]; mused := w_used[mi];
                        r_daily := dused; r_monthly := mused;
                        IF ci IS NOT NULL AND c_users[ci] <> users[i] THEN
                            r_code := 'taken';
                        ELSIF ci IS NOT NULL AND c_states[ci] <> 'released' THEN
                            r_code := 'replayed';
                        ELSIF (plan_daily[pi] >= 0 AND dused + cost > plan_daily[pi]) OR (plan_monthly[pi] >= 0 AND mused + cost > plan_monthly[pi]) THEN
                            r_code := 'refused';
                        ELSE
                            net := networks[i];
                            IF net <> '' AND users[i] = ANY(attested) THEN net := ''; END IF;
                            ni := NULL;
                            IF net <> '' THEN
                                ni := array_position(w_keys, 'net:' || net || sep || 'daily' || sep || days[i]);
                                r_network := w_used[ni];
                            END IF;
                            IF ni IS NOT NULL AND w_used[ni] + cost > network_daily THEN
                                r_code := 'network';
                            ELSE
                                IF ni IS NOT NULL THEN w_used[ni] := w_used[ni] + cost; w_delta[ni] := w_delta[ni] + cost; END IF;
                                w_used[di] := dused + cost; w_delta[di] := w_delta[di] + cost;
                                w_used[mi] := mused + cost; w_delta[mi] := w_delta[mi] + cost;
                                r_daily := dused + cost; r_monthly := mused + cost;
                                IF ci IS NULL THEN
                                    c_jobs := c_jobs || jobs[i]; ci := coalesce(array_length(c_jobs, 1), 0); c_new[ci] := true; fresh := fresh + 1;
                                END IF;
                                c_users[ci] := users[i]; c_costs[ci] := cost; c_states[ci] := 'reserved'; c_days[ci] := days[i];
                                c_months[ci] := months[i]; c_reserved[ci] := now_; c_settled[ci] := NULL; c_networks[ci] := net;
                                IF NOT coalesce(c_dirty[ci], false) THEN c_dirty[ci] := true; dirty := dirty + 1; END IF;
                                r_code := 'admitted';
                            END IF;
                        END IF;
                    ELSIF ci IS NULL THEN
                        r_code := 'notfound';
                    ELSE
                        IF c_states[ci] = 'reserved' THEN
                            IF kinds[i] = 'x' THEN
                                FOREACH wkey IN ARRAY ARRAY[c_users[ci] || sep || 'daily' || sep || c_days[ci], c_users[ci] || sep || 'monthly' || sep || c_months[ci],
                                                           CASE WHEN c_networks[ci] <> '' THEN 'net:' || c_networks[ci] || sep || 'daily' || sep || c_days[ci] END] LOOP
                                    CONTINUE WHEN wkey IS NULL;
                                    di := array_position(w_keys, wkey);
                                    IF di IS NULL THEN
                                        w_keys := w_keys || wkey; di := array_length(w_keys, 1);
                                        w_owners[di] := split_part(wkey, sep, 1); w_kinds[di] := split_part(wkey, sep, 2); w_wkeys[di] := split_part(wkey, sep, 3);
                                        w_used[di] := 0; w_delta[di] := 0;
                                    END IF;
                                    w_used[di] := greatest(0, w_used[di] - c_costs[ci]); w_delta[di] := w_delta[di] - c_costs[ci];
                                END LOOP;
                            END IF;
                            c_states[ci] := CASE WHEN kinds[i] = 'x' THEN 'released' ELSE 'committed' END;
                            c_settled[ci] := nows[i];
                            IF NOT coalesce(c_dirty[ci], false) THEN c_dirty[ci] := true; dirty := dirty + 1; END IF;
                            r_code := 'charge';
                        ELSIF c_states[ci] = (CASE WHEN kinds[i] = 'x' THEN 'released' ELSE 'committed' END) THEN
                            r_code := 'charge';
                        ELSE
                            r_code := 'settled';
                        END IF;
                        r_a := c_users[ci]; r_cost := c_costs[ci]; r_state := c_states[ci]; r_day := c_days[ci]; r_month := c_months[ci];
                        r_reserved := c_reserved[ci]; r_settled := c_settled[ci];
                    END IF;
                    RETURN NEXT;
                END LOOP;

                -- The charges made, then those settled or charged again, each in job id order (a new job id
                -- charged by another user's batch meanwhile fails the insert: unique_violation, and the
                -- batch is run again), and the windows' changes, in key order.
                IF fresh > 0 THEN
                    INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at, settled_at, network)
                    SELECT x.j, x.u, x.c, x.s, x.d, x.m, x.r, x.t, NULLIF(x.n, '')
                    FROM unnest(c_jobs, c_users, c_costs, c_states, c_days, c_months, c_reserved, c_settled, c_networks, c_new)
                        AS x(j, u, c, s, d, m, r, t, n, new)
                    WHERE x.new
                    ORDER BY x.j;
                END IF;
                IF dirty > fresh THEN
                    UPDATE quota_charge q SET cost = x.c, state = x.s, day_key = x.d, month_key = x.m, reserved_at = x.r, settled_at = x.t, network = NULLIF(x.n, '')
                    FROM (SELECT * FROM unnest(c_jobs, c_costs, c_states, c_days, c_months, c_reserved, c_settled, c_networks, c_dirty, c_new)
                              AS x(j, c, s, d, m, r, t, n, dirty, new)
                          WHERE x.dirty AND NOT coalesce(x.new, false) ORDER BY x.j) AS x
                    WHERE q.job_id = x.j;
                END IF;
                INSERT INTO quota_usage (user_id, window_kind, window_key, used)
                SELECT w.o, w.k, w.y, w.a FROM unnest(w_owners, w_kinds, w_wkeys, w_delta) AS w(o, k, y, a)
                WHERE w.a > 0 OR (w.a < 0 AND (SELECT true FROM quota_usage q WHERE q.user_id = w.o AND q.window_kind = w.k AND q.window_key = w.y LIMIT 1))
                ORDER BY w.o, w.k, w.y
                ON CONFLICT (user_id, window_kind, window_key) DO UPDATE SET used = quota_usage.used + excluded.used;
            END
            $fn$
            """,
        ]),
        // A batch decided and committed in one round trip: the procedure calls v7's function and
        // commits (a procedure may, called outside a transaction block), and answers its rows as
        // arrays, one element an operation, after the commit is durable. BEGIN and COMMIT were
        // two more round trips of each batch, and the service's hops around them (docs/quota.md).
        // postgres-nio decodes no NULL inside an array, so each array holds a stand-in where a
        // column is NULL ('' , 0 or the epoch) and `o_nulls` says which: for each operation, a
        // bit a column in the function's order from `r_a` (1) to `r_plan_ends` (2048). A
        // procedure with a SET clause cannot commit: the function keeps v7's.
        PostgresMigration("v8: a batch decided and committed in one call", [
            """
            CREATE PROCEDURE quota_batch_decide_and_commit(
                timeout_ms bigint, lock_keys text[], kinds text[], jobs text[], users text[], costs bigint[], nows timestamptz[],
                zones text[], days text[], months text[], networks text[],
                plan_names text[], plan_daily bigint[], plan_monthly bigint[], default_plan text, network_daily bigint,
                INOUT o_ops integer[] DEFAULT NULL, INOUT o_codes text[] DEFAULT NULL, INOUT o_nulls integer[] DEFAULT NULL,
                INOUT o_as text[] DEFAULT NULL, INOUT o_costs bigint[] DEFAULT NULL, INOUT o_states text[] DEFAULT NULL,
                INOUT o_days text[] DEFAULT NULL, INOUT o_months text[] DEFAULT NULL, INOUT o_reserved timestamptz[] DEFAULT NULL,
                INOUT o_settled timestamptz[] DEFAULT NULL, INOUT o_daily bigint[] DEFAULT NULL, INOUT o_monthly bigint[] DEFAULT NULL,
                INOUT o_network bigint[] DEFAULT NULL, INOUT o_plans text[] DEFAULT NULL, INOUT o_plan_ends timestamptz[] DEFAULT NULL)
            LANGUAGE plpgsql AS $fn$
            BEGIN
                SELECT coalesce(array_agg(d.r_op), '{}'), coalesce(array_agg(d.r_code), '{}'),
                       coalesce(array_agg((d.r_a IS NULL)::int + 2 * (d.r_cost IS NULL)::int + 4 * (d.r_state IS NULL)::int
                           + 8 * (d.r_day IS NULL)::int + 16 * (d.r_month IS NULL)::int + 32 * (d.r_reserved IS NULL)::int
                           + 64 * (d.r_settled IS NULL)::int + 128 * (d.r_daily IS NULL)::int + 256 * (d.r_monthly IS NULL)::int
                           + 512 * (d.r_network IS NULL)::int + 1024 * (d.r_plan IS NULL)::int + 2048 * (d.r_plan_ends IS NULL)::int), '{}'),
                       coalesce(array_agg(coalesce(d.r_a, '')), '{}'), coalesce(array_agg(coalesce(d.r_cost, 0)), '{}'),
                       coalesce(array_agg(coalesce(d.r_state, '')), '{}'), coalesce(array_agg(coalesce(d.r_day, '')), '{}'),
                       coalesce(array_agg(coalesce(d.r_month, '')), '{}'), coalesce(array_agg(coalesce(d.r_reserved, 'epoch')), '{}'),
                       coalesce(array_agg(coalesce(d.r_settled, 'epoch')), '{}'), coalesce(array_agg(coalesce(d.r_daily, 0)), '{}'),
                       coalesce(array_agg(coalesce(d.r_monthly, 0)), '{}'), coalesce(array_agg(coalesce(d.r_network, 0)), '{}'),
                       coalesce(array_agg(coalesce(d.r_plan, '')), '{}'), coalesce(array_agg(coalesce(d.r_plan_ends, 'epoch')), '{}')
                    INTO o_ops, o_codes, o_nulls, o_as, o_costs, o_states, o_days, o_months, o_reserved, o_settled, o_daily, o_monthly,
                         o_network, o_plans, o_plan_ends
                    FROM quota_batch_decide(timeout_ms, lock_keys, kinds, jobs, users, costs, nows, zones, days, months, networks,
                                            plan_names, plan_daily, plan_monthly, default_plan, network_daily) AS d;
                COMMIT;
            END
            $fn$
            """,
        ]),
    ]

    // MARK: QuotaStore

    public func reserve(_ request: ReserveQuota, now: Date) async throws -> QuotaDecision {
        try ledger.check(request)
        guard case .decision(let decision) = try await batcher.submit(.reserve(request, now: now)) else {
            preconditionFailure("a reservation is answered with a decision")
        }
        return decision
    }

    public func commit(jobId: String, now: Date) async throws -> Charge {
        try await settle(jobId: jobId, now: now, to: .committed)
    }

    public func release(jobId: String, now: Date) async throws -> Charge {
        try await settle(jobId: jobId, now: now, to: .released)
    }

    /// Commits or releases a reservation; settling it the same way twice is harmless, the other
    /// way refused. A release gives the charge back to the windows it was taken from.
    private func settle(jobId: String, now: Date, to state: Charge.State) async throws -> Charge {
        try ledger.validate(job: jobId)
        guard case .charge(let charge) = try await batcher.submit(.settle(jobId: jobId, to: state, now: now)) else {
            preconditionFailure("a settlement is answered with its charge")
        }
        return charge
    }

    public func status(userId: String, now: Date) async throws -> QuotaStatus {
        try ledger.validate(user: userId)
        let (ledger, logger) = (ledger, logger)
        return try await database.connection { db in
            try await Self.userContext(db, ledger, userId, now: now, logger: logger).status()
        }
    }

    public func setPlan(_ request: SetPlan, now: Date) async throws -> QuotaStatus {
        try ledger.check(request)
        let (ledger, logger) = (ledger, logger)
        let status = try await database.transaction { db in
            try await Self.lock(db, "user:" + request.userId, logger: logger)
            // nil keeps the zone; "" clears it.
            let keepZone = request.timeZone == nil
            let zone = request.timeZone.flatMap { $0.isEmpty ? nil : $0 }
            try await db.query("""
                INSERT INTO quota_user (id, plan, time_zone, updated_at, plan_ends_at) VALUES (\(request.userId), \(request.plan), \(zone), \(now), \(request.endsAt))
                ON CONFLICT (id) DO UPDATE SET plan = excluded.plan, updated_at = excluded.updated_at, plan_ends_at = excluded.plan_ends_at,
                    time_zone = CASE WHEN \(keepZone) THEN quota_user.time_zone ELSE excluded.time_zone END
                """, logger: logger)
            return try await Self.userContext(db, ledger, request.userId, now: now, logger: logger).status()
        }
        // This replica's batches make the user's windows in its zone from now on.
        zones.learn(user: request.userId, zone: status.timeZone)
        return status
    }

    /// A grant (or takeback) in one transaction of its own, under the user's lock as a batch's
    /// reservations take it: its charge row, then both windows moved by the amount.
    public func adjust(_ request: AdjustCredits, now: Date) async throws -> CreditsAdjusted {
        try ledger.check(request)
        let (ledger, logger) = (ledger, logger)
        return try await database.transaction { db in
            try await Self.lock(db, "user:" + request.userId, logger: logger)
            if let owner = try await db.first("SELECT user_id FROM quota_charge WHERE job_id = \(request.chargeId)", as: String.self, logger: logger) {
                guard owner == request.userId else {
                    throw BusError(Quota.ErrorCode.jobIdTaken, "adjustment \(request.adjustmentId) belongs to another user")
                }
                return CreditsAdjusted(applied: false, status: try await Self.userContext(db, ledger, request.userId, now: now, logger: logger).status())
            }
            var context = try await Self.userContext(db, ledger, request.userId, now: now, logger: logger)
            try await db.query("""
                INSERT INTO quota_charge (job_id, user_id, cost, state, day_key, month_key, reserved_at, settled_at)
                VALUES (\(request.chargeId), \(request.userId), \(-request.credits), \(Charge.State.committed.rawValue), \(context.day.key),
                        \(context.month.key), \(now), \(now))
                """, logger: logger)
            try await db.query("""
                INSERT INTO quota_usage (user_id, window_kind, window_key, used)
                VALUES (\(request.userId), 'daily', \(context.day.key), \(-request.credits)), (\(request.userId), 'monthly', \(context.month.key), \(-request.credits))
                ON CONFLICT (user_id, window_kind, window_key) DO UPDATE SET used = quota_usage.used + excluded.used
                """, logger: logger)
            context.dailyUsed -= request.credits
            context.monthlyUsed -= request.credits
            return CreditsAdjusted(applied: true, status: context.status())
        }
    }

    public func applySubscription(_ event: SubscriptionEvent, now: Date) async throws -> SubscriptionOutcome {
        try ledger.check(event)
        let (ledger, logger) = (ledger, logger)
        return try await database.transaction { db in
            try await Self.lock(db, "user:" + event.userId, logger: logger)
            if try await db.first("SELECT 1 FROM quota_subscription_event WHERE id = \(event.eventId)", as: Int32.self, logger: logger) != nil {
                return SubscriptionOutcome(result: "duplicate", status: try await Self.userContext(db, ledger, event.userId, now: now, logger: logger).status())
            }
            let last = try await db.first(
                "SELECT subscription_event_at FROM quota_user WHERE id = \(event.userId)", as: Date?.self, logger: logger
            ) ?? nil
            let result: String
            if let last, event.occurredAt < last {
                result = "stale"
            } else {
                result = "applied"
                let plan = event.effect == .grant ? event.plan : ledger.plans.defaultPlan
                let endsAt = event.effect == .grant ? event.endsAt : nil
                try await db.query("""
                    INSERT INTO quota_user (id, plan, updated_at, plan_ends_at, subscription_event_at)
                    VALUES (\(event.userId), \(plan), \(now), \(endsAt), \(event.occurredAt))
                    ON CONFLICT (id) DO UPDATE SET plan = excluded.plan, updated_at = excluded.updated_at,
                        plan_ends_at = excluded.plan_ends_at, subscription_event_at = excluded.subscription_event_at
                    """, logger: logger)
            }
            try await db.query("""
                INSERT INTO quota_subscription_event (id, user_id, type, occurred_at, result, received_at)
                VALUES (\(event.eventId), \(event.userId), \(String(event.type.prefix(100))), \(event.occurredAt), \(result), \(now))
                """, logger: logger)
            return SubscriptionOutcome(result: result, status: try await Self.userContext(db, ledger, event.userId, now: now, logger: logger).status())
        }
    }

    public func admitGuest(_ request: AdmitGuest, now: Date) async throws -> GuestAdmission {
        try ledger.check(request)
        let limit = ledger.guests.perNetworkHour
        let logger = logger
        return try await database.transaction { db in
            try await Self.lock(db, "network:" + request.network, logger: logger)
            let known = try await db.first(
                "SELECT attested_key FROM quota_guest WHERE user_id = \(request.userId)", as: String?.self, logger: logger
            )
            if request.attestedOnly == true, (known ?? nil) == nil {
                return GuestAdmission(admitted: false, limit: limit, retryAt: nil, attestationRequired: true)
            }
            if known != nil { return GuestAdmission(admitted: true, limit: limit, retryAt: nil) }
            let since = now.timeIntervalSince1970 - 3600
            let recent = try await db.all(
                "SELECT first_seen FROM quota_guest WHERE network = \(request.network) AND first_seen > \(since) ORDER BY first_seen LIMIT \(limit)",
                as: Double.self, logger: logger
            )
            if limit > 0, recent.count >= limit {
                return GuestAdmission(admitted: false, limit: limit, retryAt: Date(timeIntervalSince1970: recent[0] + 3600))
            }
            try await db.query("""
                INSERT INTO quota_guest (user_id, network, first_seen) VALUES (\(request.userId), \(request.network), \(now.timeIntervalSince1970))
                ON CONFLICT (user_id) DO NOTHING
                """, logger: logger)
            return GuestAdmission(admitted: true, limit: limit, retryAt: nil)
        }
    }

    public func attestGuest(_ request: AttestGuest, now: Date) async throws -> GuestAttestation {
        try ledger.check(request)
        let logger = logger
        return try await database.transaction { db in
            try await Self.lock(db, "attested-key:" + request.keyId, logger: logger)
            if let owner = try await db.first("SELECT user_id FROM quota_guest WHERE attested_key = \(request.keyId)", as: String.self, logger: logger) {
                return GuestAttestation(attested: owner == request.userId)
            }
            try await db.query("""
                INSERT INTO quota_guest (user_id, network, first_seen, attested_key) VALUES (\(request.userId), \(request.network), \(now.timeIntervalSince1970), \(request.keyId))
                ON CONFLICT (user_id) DO UPDATE SET attested_key = excluded.attested_key
                """, logger: logger)
            return GuestAttestation(attested: true)
        }
    }

    public func usage(userId: String, now: Date) async throws -> UserUsage {
        try ledger.validate(user: userId)
        let (ledger, logger) = (ledger, logger)
        return try await database.connection { db in
            let status = try await Self.userContext(db, ledger, userId, now: now, logger: logger).status()
            let rows = try await db.allRows(
                "SELECT \(unescaped: Self.chargeColumns), network FROM quota_charge WHERE user_id = \(userId) ORDER BY reserved_at DESC LIMIT 100",
                as: ChargeRow.self, logger: logger
            )
            return UserUsage(status: status, charges: rows.map { Self.charge($0).charge })
        }
    }

    public func staleReservations(before cutoff: Date, limit: Int) async throws -> [StaleReservation] {
        let logger = logger
        return try await database.connection { db in
            try await db.allRows(
                "SELECT job_id, reserved_at FROM quota_charge WHERE state = 'reserved' AND reserved_at < \(cutoff) ORDER BY reserved_at LIMIT \(limit)",
                as: (String, Date).self, logger: logger
            ).map { StaleReservation(jobId: $0.0, reservedAt: $0.1) }
        }
    }

    /// Deletes up to `limit` settled charges settled before `cutoff`, oldest first; skips rows a
    /// batch holds (it may be charging the same id again right now).
    public func forget(settledBefore cutoff: Date, limit: Int) async throws -> Int {
        let logger = logger
        return try await database.connection { db in
            try await db.all("""
                DELETE FROM quota_charge WHERE job_id IN (
                    SELECT job_id FROM quota_charge WHERE state <> 'reserved' AND settled_at < \(cutoff)
                    ORDER BY settled_at LIMIT \(limit) FOR UPDATE SKIP LOCKED)
                RETURNING job_id
                """, as: String.self, logger: logger).count
        }
    }

    // MARK: Rows

    typealias ChargeRow = (String, String, Int, String, String, String, Date, Date?, String?)
    static let chargeColumns: String = "job_id, user_id, cost, state, day_key, month_key, reserved_at, settled_at"

    static func charge(_ row: ChargeRow) -> (charge: Charge, network: String?) {
        (Charge(jobId: row.0, userId: row.1, cost: row.2, state: Charge.State(rawValue: row.3) ?? .reserved,
                dayKey: row.4, monthKey: row.5, reservedAt: row.6, settledAt: row.7), row.8)
    }

    /// Holds `key` (a user, a network) until the transaction ends.
    static func lock(_ db: PostgresConnection, _ key: String, logger: Logger) async throws {
        try await db.query("SELECT pg_advisory_xact_lock(hashtext(\("quota:" + key)))", logger: logger)
    }

    typealias UserRow = (String, String?, Date?)
    static let userColumns = "plan, time_zone, plan_ends_at"

    /// The user's plan (the default from its end on), zone, windows now and what they used.
    static func userContext(_ db: PostgresConnection, _ ledger: QuotaLedger, _ userId: String, now: Date, logger: Logger) async throws -> QuotaLedger.UserContext {
        let row = try await db.firstRow(
            "SELECT \(unescaped: userColumns) FROM quota_user WHERE id = \(userId)", as: UserRow.self, logger: logger
        )
        var context = userContext(ledger, userId, row, now: now)
        for try await (kind, value) in try await db.query("""
            SELECT window_kind, used FROM quota_usage WHERE user_id = \(userId)
            AND ((window_kind = 'daily' AND window_key = \(context.day.key)) OR (window_kind = 'monthly' AND window_key = \(context.month.key)))
            """, logger: logger).decode((String, Int).self) {
            if kind == "daily" { context.dailyUsed = value } else { context.monthlyUsed = value }
        }
        return context
    }

    /// The user's plan (the default from its end on), zone and windows now, from their row (nil:
    /// none yet), with nothing used.
    static func userContext(_ ledger: QuotaLedger, _ userId: String, _ row: UserRow?, now: Date) -> QuotaLedger.UserContext {
        var planName = row?.0
        var planEndsAt = row?.2 ?? nil
        if let end = planEndsAt, now >= end {
            planName = nil
            planEndsAt = nil
        }
        let timeZone = row?.1 ?? nil
        let (day, month) = ledger.windows.windows(containing: now, timeZone: timeZone)
        return QuotaLedger.UserContext(
            userId: userId, plan: ledger.plans.effectivePlan(planName), planEndsAt: planEndsAt, timeZone: timeZone,
            day: day, month: month, dailyUsed: 0, monthlyUsed: 0
        )
    }
}
