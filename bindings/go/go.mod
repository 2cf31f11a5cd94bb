module github.com/flashspec/flashspec/bindings/go

go 1.19
