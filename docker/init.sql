-- Runs once, when the MariaDB data volume is first created (/docker-entrypoint-initdb.d).
--
-- The image has already created user `cdc`@'%' from MARIADB_USER / MARIADB_PASSWORD (docker/.env:
-- MYSQL_PASSWORD) with no privileges at all, because compose sets no MARIADB_DATABASE. Here it gets
-- exactly what the ingestion job needs, and nothing else:
--   SELECT              the lock-free chunked snapshot
--   REPLICATION SLAVE   reading the binlog
--   BINLOG MONITOR      SHOW MASTER STATUS (the current end of the binlog)
-- No RELOAD, no LOCK TABLES: the job never locks the source.

-- Only created here if the image did not create it (no password set): locked, so it cannot log in.
CREATE USER IF NOT EXISTS 'cdc'@'%' ACCOUNT LOCK;
GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'cdc'@'%';

-- A small sample shop. docker/pipeline.yaml captures shop.* except shop.audit_log.
CREATE DATABASE shop CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
USE shop;

CREATE TABLE customers (
  id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  name VARCHAR(80) NOT NULL,
  email VARCHAR(120) NOT NULL UNIQUE,
  country CHAR(2) NOT NULL,
  signed_up DATETIME(3) NOT NULL,
  balance DECIMAL(12, 2) NOT NULL DEFAULT 0
);

CREATE TABLE products (
  sku VARCHAR(32) NOT NULL PRIMARY KEY,
  title VARCHAR(200) NOT NULL,
  price DECIMAL(10, 2) NOT NULL,
  attrs JSON
);

CREATE TABLE orders (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer_id INT UNSIGNED NOT NULL,
  placed_at TIMESTAMP(3) NOT NULL,
  status ENUM('new', 'paid', 'shipped', 'cancelled') NOT NULL,
  note TEXT
);

-- A composite key: docker/pipeline.yaml names it as the chunk key in table_options.
CREATE TABLE order_lines (
  order_id BIGINT UNSIGNED NOT NULL,
  line_no SMALLINT UNSIGNED NOT NULL,
  sku VARCHAR(32) NOT NULL,
  quantity INT NOT NULL,
  unit_price DECIMAL(10, 2) NOT NULL,
  PRIMARY KEY (order_id, line_no)
);

-- Not captured (tables.exclude).
CREATE TABLE audit_log (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  message VARCHAR(500) NOT NULL
);

INSERT INTO customers (name, email, country, signed_up, balance) VALUES
  ('Ada Lovelace', 'ada@example.com', 'GB', '2024-01-05 09:15:00.000', 120.50),
  ('Grace Hopper', 'grace@example.com', 'US', '2024-02-11 14:02:33.250', 0.00),
  ('Katherine Johnson', 'katherine@example.com', 'US', '2024-03-20 08:45:10.500', 42.00),
  ('Émilie du Châtelet', 'emilie@example.com', 'FR', '2024-04-02 17:30:00.125', 310.75),
  ('Hedy Lamarr', 'hedy@example.com', 'AT', '2024-05-18 11:11:11.111', 5.25);

INSERT INTO products (sku, title, price, attrs) VALUES
  ('MUG-001', 'Coffee mug ☕', 9.90, JSON_OBJECT('color', 'white', 'volume_ml', 350)),
  ('TEE-002', 'T-shirt', 19.00, JSON_OBJECT('size', 'M')),
  ('BAG-003', 'Tote bag', 12.50, NULL),
  ('PEN-004', 'Fountain pen', 45.00, JSON_OBJECT('nib', 'F'));

INSERT INTO orders (customer_id, placed_at, status, note) VALUES
  (1, '2025-03-01 08:00:00.000', 'paid', NULL),
  (2, '2025-03-01 09:30:00.000', 'shipped', 'leave at the door'),
  (1, '2025-03-02 12:00:00.000', 'new', NULL),
  (4, '2025-03-03 16:45:00.000', 'cancelled', 'changed my mind');

INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price) VALUES
  (1, 1, 'MUG-001', 2, 9.90),
  (1, 2, 'PEN-004', 1, 45.00),
  (2, 1, 'TEE-002', 3, 19.00),
  (3, 1, 'BAG-003', 1, 12.50),
  (4, 1, 'MUG-001', 1, 9.90);

INSERT INTO audit_log (message) VALUES ('sample data loaded');
