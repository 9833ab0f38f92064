from contramine.pipeline.report import main

main()
