DROP TABLE payments;
DROP TABLE orders;
