BEGIN TRANSACTION;
CREATE TABLE bench_meta (
	"key" VARCHAR(40) NOT NULL, 
	value VARCHAR(200) NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "bench_meta" VALUES('schema_version','6');
CREATE TABLE cases (
	id INTEGER NOT NULL, 
	run_id VARCHAR(40) NOT NULL, 
	case_key VARCHAR(40) NOT NULL, 
	suite VARCHAR(200) NOT NULL, 
	line VARCHAR(200) NOT NULL, 
	arch VARCHAR(200) NOT NULL, 
	status VARCHAR(20) NOT NULL, 
	message TEXT NOT NULL, 
	config JSON NOT NULL, 
	workload JSON NOT NULL, 
	metrics JSON NOT NULL, 
	samples_s JSON NOT NULL, 
	duration_s FLOAT NOT NULL, 
	finished_at VARCHAR(40) NOT NULL, 
	rounds JSON, 
	group_key VARCHAR(80), 
	sdpa_backend VARCHAR(80), 
	PRIMARY KEY (id), 
	CONSTRAINT uq_case_per_run UNIQUE (run_id, case_key), 
	FOREIGN KEY(run_id) REFERENCES runs (id)
);
INSERT INTO "cases" VALUES(1,'20261128-100749-ad443bcc','k8','tiny','L','transformer','ok','','{"n_heads": 2}','{"seq_len": 8}','{"median_ms": 1.5, "macs": 8000}','[0.0015, 0.0016]',0.1,'2026-11-28T10:07:49+00:00','[1, 1]','g','math');
INSERT INTO "cases" VALUES(2,'20261128-100749-ad443bcc','k16','tiny','L','transformer','ok','','{"n_heads": 2}','{"seq_len": 16}','{"median_ms": 3.0, "macs": 16000}','[0.0015, 0.0016]',0.1,'2026-11-28T10:07:49+00:00','[1, 1]','g','math');
CREATE TABLE experiments (
	id INTEGER NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	quick BOOLEAN NOT NULL, 
	seeds JSON NOT NULL, 
	env JSON NOT NULL, 
	result JSON NOT NULL, 
	finished_at VARCHAR(40) NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "experiments" VALUES(1,'mnist1d',1,'[0, 1]','{"hard": {"cpu": "x86_64"}, "soft": {"commit": "bfa1d1f"}}','{"accuracy": [0.5, 0.75], "code_hash": "abc"}','2026-11-28T10:07:49+00:00');
CREATE TABLE run_leases (
	run_id VARCHAR(40) NOT NULL, 
	owner VARCHAR(120) NOT NULL, 
	host VARCHAR(200) NOT NULL, 
	pid INTEGER NOT NULL, 
	pid_started FLOAT NOT NULL, 
	acquired_at VARCHAR(40) NOT NULL, 
	heartbeat FLOAT NOT NULL, 
	PRIMARY KEY (run_id)
);
INSERT INTO "run_leases" VALUES('20261128-100749-ad443bcc','vm/10179/23190a6e2f45','vm',10179,1795860468.92,'2026-11-28T10:07:49+00:00',1.79586046943104553222e+09);
CREATE TABLE runs (
	id VARCHAR(40) NOT NULL, 
	suite VARCHAR(200) NOT NULL, 
	suite_path TEXT, 
	quick BOOLEAN NOT NULL, 
	status VARCHAR(20) NOT NULL, 
	n_cases INTEGER NOT NULL, 
	started_at VARCHAR(40) NOT NULL, 
	finished_at VARCHAR(40), 
	env JSON NOT NULL, 
	options JSON NOT NULL, 
	suite_text TEXT, 
	suite_spec JSON, 
	invocation JSON, 
	PRIMARY KEY (id)
);
INSERT INTO "runs" VALUES('20261128-100749-ad443bcc','tiny','suites/tiny.toml',1,'done',2,'2026-11-28T10:07:49+00:00','2026-11-28T10:07:49+00:00','{"hard": {"cpu": "x86_64"}, "soft": {"commit": "bfa1d1f"}}','{"interleave": true, "processes": 1}','name = ''tiny''
','{"description": "two lengths", "metrics": ["latency"], "fixed": {"arch": "transformer"}, "sweep": {"seq_len": [8, 16]}, "lines": {"L": {"n_heads": 2}}, "plot": {"x": "seq_len"}}','{"command": "run", "argv": ["run", "tiny"]}');
CREATE INDEX ix_experiments_name ON experiments (name);
CREATE INDEX ix_cases_run_id ON cases (run_id);
COMMIT;
