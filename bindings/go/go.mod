module flashspec

go 1.19
