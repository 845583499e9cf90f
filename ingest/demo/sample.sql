-- The demo's sample shop: several key types (dense integer, case-insensitive string, composite, binary).
CREATE DATABASE shop;
USE shop;

CREATE TABLE customers (
  id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  name VARCHAR(60) NOT NULL,
  email VARCHAR(120) NOT NULL,
  country CHAR(2) NOT NULL,
  signed_up DATETIME(3) NOT NULL,
  balance DECIMAL(12,2) NOT NULL DEFAULT 0
);
INSERT INTO customers (name, email, country, signed_up, balance)
SELECT CONCAT('Customer ', seq), CONCAT('c', seq, '@example.com'), ELT(1 + seq % 5, 'DE', 'FR', 'US', 'JP', 'BR'),
       TIMESTAMP('2024-01-01') + INTERVAL seq * 37 MINUTE, ROUND(seq * 1.37 % 900, 2)
FROM seq_1_to_3000;

CREATE TABLE products (
  sku VARCHAR(32) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY,
  title VARCHAR(200) NOT NULL,
  price DECIMAL(10,2) NOT NULL,
  tags SET('new', 'sale', 'eco', 'gift'),
  attrs JSON
);
INSERT INTO products
SELECT CONCAT(ELT(1 + seq % 4, 'ab', 'AC', 'b', 'Zz'), '-', LPAD(seq, 5, '0')), CONCAT('Product ', seq, ' ☕'),
       ROUND(1 + seq * 0.73 % 250, 2), ELT(1 + seq % 3, 'new', 'sale,eco', NULL),
       JSON_OBJECT('weight_g', seq % 900, 'color', ELT(1 + seq % 3, 'red', 'green', 'blue'))
FROM seq_1_to_800;

CREATE TABLE orders (
  customer_id INT UNSIGNED NOT NULL,
  order_no BIGINT UNSIGNED NOT NULL,
  placed_at TIMESTAMP(3) NOT NULL,
  status ENUM('new', 'paid', 'shipped', 'cancelled') NOT NULL,
  total DECIMAL(12,2) NOT NULL,
  note TEXT,
  PRIMARY KEY (customer_id, order_no)
);
INSERT INTO orders
SELECT 1 + seq % 40, 18446744073709540000 + seq, TIMESTAMP('2025-03-01 08:00:00') + INTERVAL seq MINUTE,
       ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'cancelled'), ROUND(seq * 3.1 % 500, 2),
       IF(seq % 7 = 0, 'leave at the door', NULL)
FROM seq_1_to_5000;

CREATE TABLE sessions (
  id VARBINARY(16) NOT NULL PRIMARY KEY,
  customer_id INT UNSIGNED NOT NULL,
  last_seen TIMESTAMP NOT NULL,
  payload BLOB
);
INSERT INTO sessions
SELECT UNHEX(MD5(seq)), 1 + seq % 3000, TIMESTAMP('2025-06-01') + INTERVAL seq SECOND, UNHEX(SHA1(seq))
FROM seq_1_to_1500;
