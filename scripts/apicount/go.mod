module github.com/crdbwork/crdbwork/scripts/apicount

go 1.25.0
